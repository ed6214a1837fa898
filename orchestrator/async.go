package orchestrator

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// recordAsync is the second half of an asynchronous checkpoint (api.CheckpointRequest.Async):
// the sandbox runs again when it is called; it returns the checkpoint as cut and makes it
// durable in the background, holding s.mu (handed over by checkpoint) until it is done, so
// that every later operation on the sandbox (rollback, commit, checkpoint, push, release,
// state patches) waits for it. A failure is reported to the next checkpoint, rollback or
// commit (finishPending).
func (o *Orchestrator) recordAsync(ctx context.Context, s *session, req api.CheckpointRequest, rec ckptRecord, pending pendingFiles,
	pp *procsPending, frozen time.Duration, start time.Time) api.Checkpoint {
	rec.FrozenMS, rec.TotalMS = ms(frozen), ms(time.Since(start))
	v := rec.Checkpoint
	if rec.ProcCkpt != nil {
		for _, e := range rec.ProcCkpt.Procs {
			v.Processes = append(v.Processes, api.CheckpointProcess{Pid: e.NSPid, Comm: e.Comm, Kept: e.Kept, Reason: e.Reason})
		}
	}
	bg := context.WithoutCancel(ctx)
	go func() {
		defer s.mu.Unlock()
		if _, err := o.record(bg, s, req, rec, pending, pp, frozen, start); err != nil {
			s.asyncErr = fmt.Errorf("the asynchronous checkpoint %s of sandbox %q was not recorded: %v: %w", rec.ID, s.id, err, errdefs.ErrAborted)
			log.L(bg).Error("asynchronous checkpoint", "sandbox", s.id, "checkpoint", rec.ID, "error", err)
		}
	}()
	return v
}

// takeAsyncError returns (once) the failure of the last asynchronous checkpoint. Callers
// hold s.mu.
func (s *session) takeAsyncError() error {
	err := s.asyncErr
	s.asyncErr = nil
	return err
}
