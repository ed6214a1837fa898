package orchestrator

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// Rollback returns a sandbox's files, agent state and held effects to a checkpoint, in place:
// freeze, stop the processes started since, restore files through the merged mount, undo the
// state ops, drop the effects, thaw. The checkpoints after the target are discarded.
func (o *Orchestrator) Rollback(ctx context.Context, id string, req api.RollbackRequest) (api.RollbackResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.RollbackResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	i, err := s.rollbackTarget(req)
	if err != nil {
		return api.RollbackResult{}, err
	}
	target := s.ckpts[i]
	res := api.RollbackResult{ID: id, To: target.ID}
	frozen, err := o.undo(ctx, s, target, &res)
	if err != nil {
		return res, fmt.Errorf("rollback sandbox %q to %s: %w", id, target.ID, err)
	}
	for _, c := range s.ckpts[i+1:] {
		_ = s.rec.remove(c.ID)
		removeImages(c)
	}
	s.ckpts = s.ckpts[:i+1]
	o.effects.SetCheckpoint(s.id, target.ID)
	res.FrozenMS, res.TotalMS = ms(frozen), ms(time.Since(start))
	log.L(ctx).Info("sandbox rolled back", "sandbox", id, "checkpoint", target.ID, "files", res.FilesRestored,
		"ops", res.OpsUndone, "effects", res.EffectsDropped, "processes", res.ProcessesStopped,
		"frozen_ms", res.FrozenMS, "total_ms", res.TotalMS)
	return res, nil
}

// rollbackTarget validates a rollback request and returns the target's index.
func (s *session) rollbackTarget(req api.RollbackRequest) (int, error) {
	to := req.To
	if to == "" {
		to = s.latest().ID
	}
	i := s.find(to)
	if i < 0 {
		return 0, fmt.Errorf("checkpoint %q of sandbox %q: %w", to, s.id, errdefs.ErrNotFound)
	}
	if c := s.meta.CommitAfter; c != "" && ckptNum(to) <= ckptNum(c) && !req.Force {
		return 0, fmt.Errorf("checkpoint %s of sandbox %q is at or before the last commit (checkpoint %s), whose effects were sent; take a new checkpoint, or use --force to roll back files and state anyway: %w",
			to, s.id, c, errdefs.ErrFailedPrecondition)
	}
	// The state log must still reach back to the target (compaction drops old history).
	if _, err := s.state.Log(s.ckpts[i].StateSeq, s.state.Seq()); err != nil {
		return 0, fmt.Errorf("agent state of checkpoint %s is no longer available: %w", to, err)
	}
	return i, nil
}

// undo runs the frozen part of a rollback and returns how long the sandbox was frozen.
func (o *Orchestrator) undo(ctx context.Context, s *session, target ckptRecord, res *api.RollbackResult) (time.Duration, error) {
	if err := s.frz.Freeze(ctx); err != nil {
		return 0, err
	}
	frozenAt := time.Now()
	defer o.thaw(ctx, s)
	procs, err := s.frz.Procs()
	if err != nil {
		return 0, err
	}
	if res.ProcessesStopped, err = killNewer(procs, target.Procs); err != nil {
		return 0, err
	}
	fsRes, err := s.fs.Rollback(ctx, overlay.RollbackRequest{Merged: s.merged(), Upper: s.sb.Layout.Upper,
		Lower: s.sb.Layout.Lower, Target: target.ID, Open: overlay.WritableFiles(pids(procs))})
	if err != nil {
		return 0, fmt.Errorf("restore files: %w", err)
	}
	res.FilesRestored = fsRes.FilesRestored
	if res.OpsUndone, err = s.state.RollbackTo(ctx, target.StateSeq); err != nil {
		return 0, fmt.Errorf("files restored, but undoing agent state failed: %w", err)
	}
	if res.EffectsDropped, err = o.effects.Rollback(ctx, s.id, target.EffectsWatermark); err != nil {
		return 0, fmt.Errorf("files and state restored, but dropping effects failed: %w", err)
	}
	if target.Level == api.LevelL3 {
		return time.Since(frozenAt), o.restoreProcesses(ctx, s, target)
	}
	if err := o.thaw(ctx, s); err != nil {
		return 0, err
	}
	return time.Since(frozenAt), nil
}

// merged is the sandbox's root as its init sees it, the merged overlay mount.
func (s *session) merged() string { return fmt.Sprintf("/proc/%d/root", s.sb.InitPid) }

// killNewer SIGKILLs the sandbox's processes (now) that did not exist at the checkpoint (by
// pid and start time). Signals to frozen processes take effect when they are thawed.
func killNewer(now, keep []pool.Proc) (int, error) {
	old := make(map[pool.Proc]bool, len(keep))
	for _, p := range keep {
		old[p] = true
	}
	n := 0
	for _, p := range now {
		if !old[p] {
			if err := syscall.Kill(p.Pid, syscall.SIGKILL); err == nil {
				n++
			}
		}
	}
	return n, nil
}

// resetFiles is the pool's Reset hook: on release, with only init left running, it returns
// the sandbox's files to its first checkpoint (the sandbox as leased).
func (o *Orchestrator) resetFiles(ctx context.Context, sb pool.Sandbox) error {
	s, err := o.session(ctx, sb.ID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ckpts) == 0 {
		return fmt.Errorf("sandbox %q has no base checkpoint: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	_, err = s.fs.Rollback(ctx, overlay.RollbackRequest{Merged: s.merged(), Upper: sb.Layout.Upper,
		Lower: sb.Layout.Lower, Target: s.ckpts[0].ID})
	return err
}

// Commit releases the sandbox's held effects and moves its commit point to the latest
// checkpoint: later rollbacks may not go to it or before it without force.
func (o *Orchestrator) Commit(ctx context.Context, id string) (api.CommitResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.CommitResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	res := api.CommitResult{ID: id, Checkpoint: s.latest().ID}
	res.EffectsReleased, res.EffectsFailed, err = o.effects.Commit(ctx, id)
	if err != nil {
		return res, fmt.Errorf("commit sandbox %q: %w", id, err)
	}
	meta := s.meta
	meta.CommitAfter = res.Checkpoint
	if err := s.rec.writeMeta(meta); err != nil {
		return res, fmt.Errorf("record commit point of %q: %w", id, err)
	}
	s.meta = meta
	log.L(ctx).Info("sandbox committed", "sandbox", id, "checkpoint", res.Checkpoint,
		"released", res.EffectsReleased, "failed", res.EffectsFailed)
	return res, nil
}
