package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/criu/proctpl"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// cleanupTimeout bounds cleanups that must run even if the request is gone, such as the
// resume after an L3 dump (a thaw takes no context: it cannot be cancelled).
const cleanupTimeout = 10 * time.Second

func levelOf(l string) (overlay.Level, error) {
	switch l {
	case "", api.LevelL1:
		return overlay.L1, nil
	case api.LevelL2:
		return overlay.L2, nil
	case api.LevelL3:
		return overlay.L2, nil // the files of an L3 checkpoint are a full copy
	}
	return 0, fmt.Errorf("checkpoint level %q: want l1, l2 or l3: %w", l, errdefs.ErrInvalidArgument)
}

// Checkpoint takes a checkpoint of a leased sandbox.
func (o *Orchestrator) Checkpoint(ctx context.Context, id string, req api.CheckpointRequest) (api.Checkpoint, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.Checkpoint{}, err
	}
	return o.checkpoint(ctx, s, req)
}

// checkpoint is the consistent cut (docs/architecture.md): freeze, capture the upper dir, read the state
// sequence number, the effect watermark and the process list, thaw; then record it durably.
// The thaw runs even if ctx is cancelled.
func (o *Orchestrator) checkpoint(ctx context.Context, s *session, req api.CheckpointRequest) (api.Checkpoint, error) {
	s.mu.Lock()
	locked := true // an asynchronous checkpoint hands the lock to its background half
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	if err := o.finishPending(ctx, s); err != nil {
		return api.Checkpoint{}, err
	}
	autoL2 := req.Level == "" && o.opts.L2Every > 0 && s.l1Chain() >= o.opts.L2Every
	if autoL2 {
		req.Level = api.LevelL2 // compaction: bound the delta chain a rollback has to fold
		req.Message = strings.TrimSpace(req.Message + " (automatic l2)")
	}
	level, err := levelOf(req.Level)
	if err != nil {
		return api.Checkpoint{}, err
	}
	if autoL2 { // cut as a delta, made full after the answer (compactLater)
		level = overlay.L1
	}
	if err := validateName(req.Name); err != nil {
		return api.Checkpoint{}, err
	}
	withProcs, err := o.wantsProcesses(s, req)
	if err != nil {
		return api.Checkpoint{}, err
	}
	start := time.Now()
	rec := ckptRecord{Checkpoint: api.Checkpoint{ID: strconv.Itoa(s.meta.Next), Sandbox: s.id,
		Level: req.Level, Message: req.Message, Name: req.Name, Created: start.UTC()}, TreeOps: true}
	if rec.Level == "" {
		rec.Level = api.LevelL1
	}
	if l := s.latest(); l != nil {
		rec.Parent = l.ID
	}
	var pp *procsPending // the templates of a checkpoint with processes, made after the thaw
	fallback, noFallback := "", ""
	if withProcs && rec.Level != api.LevelL3 {
		procs, err := s.sandboxProcs() // running: what the cut will find, but a race
		if err != nil {
			return api.Checkpoint{}, err
		}
		if fallback, noFallback = o.criuFallback(s, procs); fallback != "" { // the whole sandbox goes to CRIU
			rec.Level, level = api.LevelL3, overlay.L2
			log.L(ctx).Info("checkpoint with processes falls back to CRIU", "sandbox", s.id, "reason", fallback)
		} else {
			o.hugePages(ctx, s, procs)
		}
	}
	cut := o.cut
	switch {
	case rec.Level == api.LevelL3:
		cut = o.cutL3
	case withProcs:
		cut = o.cutWithProcesses(&pp, noFallback)
	}
	frozen, pending, err := cut(ctx, s, level, &rec)
	s.dumped = s.dumped || rec.Level == api.LevelL3
	if err != nil {
		return api.Checkpoint{}, err
	}
	if fallback != "" {
		rec.ProcCkpt = s.criuEntries(rec.Procs, fallback)
	}
	if autoL2 && rec.Level == api.LevelL2 {
		s.toCompact = rec.ID
	}
	if req.Async {
		if pp != nil { // the answer says how each process is kept
			rec.ProcCkpt, _, frozen = pp.wait()
		}
		locked = false
		return o.recordAsync(ctx, s, req, rec, pending, pp, frozen, start), nil
	}
	return o.record(ctx, s, req, rec, pending, pp, frozen, start)
}

// record makes a cut checkpoint durable (its files and record, one write) and adds it to
// the session. Callers hold s.mu.
//
// With pp (a checkpoint with processes), the templates may still be in the making: the
// record waits for them, and says how each process is kept as it was made. Its write runs
// after them, not beside: the seized processes stay stopped until their templates are
// made, and a write beside them (its encoding, its sync) takes the cores their forks need,
// on a small host 0.3-0.4 ms more of the window from the freeze to the last resume, for
// 0.6 ms less of the whole checkpoint (paired runs, docs/benchmarks.md, session 22). The
// window is what the sandbox feels; the rest is hidden under the caller's next step.
func (o *Orchestrator) record(ctx context.Context, s *session, req api.CheckpointRequest, rec ckptRecord, pending pendingFiles,
	pp *procsPending, frozen time.Duration, start time.Time) (api.Checkpoint, error) {
	var err error
	var tpls map[int]*proctpl.Template
	if pp != nil {
		rec.ProcCkpt, tpls, frozen = pp.wait()
	}
	defer func() { // a checkpoint that failed does not keep them
		if s.tpls[rec.ID] == nil {
			for _, tp := range tpls {
				tp.Release()
			}
		}
	}()
	if rec.Parent != "" { // the state ops since the parent, for moves across the tree
		if rec.StateOps, err = s.state.Log(s.headSeq, rec.StateSeq); err != nil {
			pending.Abort()
			removeImages(rec)
			return api.Checkpoint{}, fmt.Errorf("record the state ops of checkpoint %s: %w", rec.ID, err)
		}
	}
	// The record travels in the layer pack: one durable write for files and record, after
	// the sandbox runs again.
	rec.FrozenMS, rec.TotalMS = ms(frozen), ms(time.Since(start))
	data, err := json.Marshal(rec)
	if err != nil {
		pending.Abort()
		return api.Checkpoint{}, err
	}
	if err := failpoint.Inject("checkpoint/before-commit"); err != nil {
		pending.Abort()
		removeImages(rec)
		return api.Checkpoint{}, err
	}
	tc := time.Now()
	if _, err := pending.Commit(data); err != nil {
		removeImages(rec)
		return api.Checkpoint{}, fmt.Errorf("record checkpoint %s of %s: %w", rec.ID, s.id, err)
	}
	_ = failpoint.Inject("checkpoint/committed") // only "exit" means something here: it is durable
	s.ckpts = append(s.ckpts, rec)
	s.head, s.headSeq = rec.ID, rec.StateSeq
	s.keepTemplates(rec.ID, tpls)
	s.meta.Next++
	if req.Pin {
		o.pin(ctx, s, rec.ID, true)
	}
	if err := o.effects.SetCheckpoint(ctx, s.id, rec.ID); err != nil {
		// The checkpoint is durable; effects recorded now carry the previous tag.
		log.L(ctx).Error("tag effects with checkpoint", "sandbox", s.id, "checkpoint", rec.ID, "error", err)
	}
	rec.TotalMS = ms(time.Since(start))
	log.L(ctx).Info("checkpoint created", "sandbox", s.id, "checkpoint", rec.ID, "level", rec.Level,
		"files", rec.FilesChanged, "bytes", rec.Bytes, "frozen_ms", rec.FrozenMS, "total_ms", rec.TotalMS)
	tr := time.Now()
	o.retain(ctx, s)
	if s.toCompact == rec.ID {
		o.foldLater(ctx, s)
	}
	tb := time.Now()
	if len(tpls) > 0 {
		o.boundTemplates(ctx, s, rec.ID)
		o.preforkLater(ctx, s, rec.ID)
	}
	tv := time.Now()
	v := s.viewMeasured(rec, false) // templates just made: nothing diverged yet (ls and inspect measure)
	log.L(ctx).Debug("checkpoint record phases", "sandbox", s.id, "checkpoint", rec.ID, "before_commit", tc.Sub(start),
		"commit", tr.Sub(tc), "retain", tb.Sub(tr), "bound", tv.Sub(tb), "view", time.Since(tv))
	return v, nil
}

// l1Chain counts the L1 checkpoints from the head up to the last full (L2/L3) one, the
// first checkpoint excluded.
func (s *session) l1Chain() int {
	n := 0
	for _, id := range s.ancestors(s.head) {
		c := s.ckpts[s.find(id)]
		if c.Level != api.LevelL1 || c.Parent == "" {
			break
		}
		n++
	}
	return n
}

// cut runs the frozen window and fills rec; it returns how long the sandbox was frozen and
// the prepared capture, which the caller commits (with the record) or aborts.
func (o *Orchestrator) cut(ctx context.Context, s *session, level overlay.Level, rec *ckptRecord) (time.Duration, pendingFiles, error) {
	start := time.Now()
	if err := s.freeze(ctx, s.pin()); err != nil {
		return 0, nil, err
	}
	frozenAt := time.Now()
	defer o.thaw(ctx, s)
	if err := failpoint.Inject("checkpoint/frozen"); err != nil {
		return 0, nil, err
	}
	pending, err := o.capture(ctx, s, level, rec, nil)
	if err != nil {
		return 0, nil, err
	}
	if err := failpoint.Inject("checkpoint/captured"); err != nil {
		pending.Abort()
		return 0, nil, err
	}
	captured := time.Now()
	if err := o.thaw(ctx, s); err != nil {
		pending.Abort()
		return 0, nil, err
	}
	thawed := time.Now()
	log.L(ctx).Debug("checkpoint cut", "sandbox", s.id, "checkpoint", rec.ID,
		"freeze", frozenAt.Sub(start), "capture", captured.Sub(frozenAt), "thaw", thawed.Sub(captured))
	return thawed.Sub(frozenAt), pending, nil
}

// capture records a frozen sandbox into rec: its processes (procs, when the caller listed
// them: sandboxProcs), files (prepared, not yet durable), state sequence number and effect
// watermark.
func (o *Orchestrator) capture(ctx context.Context, s *session, level overlay.Level, rec *ckptRecord, procs []pool.Proc) (pendingFiles, error) {
	var err error
	if procs == nil {
		if procs, err = s.sandboxProcs(); err != nil {
			return nil, err
		}
	}
	rec.Procs = procs
	p, err := s.fs.Prepare(ctx, overlay.CaptureRequest{ID: rec.ID, Parent: rec.Parent, Level: level,
		Upper: s.sb.Layout.Upper, Lower: s.sb.Layout.Lower, Open: overlay.WritableFiles(pids(rec.Procs))})
	if err != nil {
		return nil, fmt.Errorf("capture files of %s: %w", s.id, err)
	}
	rec.FilesChanged, rec.Bytes = p.Changed()
	rec.StateSeq, rec.EffectsWatermark = s.state.Seq(), o.effects.Watermark(s.id)
	return p, nil
}

// pids returns the process IDs of procs.
func pids(procs []pool.Proc) []int {
	out := make([]int, len(procs))
	for i, p := range procs {
		out[i] = p.Pid
	}
	return out
}

// thaw thaws the sandbox and logs a failure; the freezer takes no context, so a cancelled
// request still thaws (ctx only carries the logger).
func (o *Orchestrator) thaw(ctx context.Context, s *session) error {
	s.unpin()
	err := s.frz.Thaw()
	if err != nil {
		log.L(ctx).Error("thaw sandbox", "sandbox", s.id, "error", err)
	}
	return err
}

// Checkpoints lists a sandbox's checkpoints, oldest first.
func (o *Orchestrator) Checkpoints(ctx context.Context, id string) ([]api.Checkpoint, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := append(make([]api.Checkpoint, 0, len(s.inherited)+len(s.ckpts)), s.inherited...)
	var tplBytes int64
	for _, c := range s.ckpts {
		v := s.view(c)
		tplBytes += v.TemplateBytes
		out = append(out, v)
	}
	s.tplBytes.Store(tplBytes) // the templates' memory as measured now (metrics)
	return out, nil
}

// InspectCheckpoint returns one checkpoint.
func (o *Orchestrator) InspectCheckpoint(ctx context.Context, id, ckpt string) (api.Checkpoint, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.Checkpoint{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, err := s.resolve(ckpt)
	if err != nil {
		return api.Checkpoint{}, err
	}
	return s.view(s.ckpts[i]), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
