package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// cleanupTimeout bounds the rollback, commit and release at the end of a task, which run
// even when the run was cancelled.
const cleanupTimeout = time.Minute

// taskRun is one task in progress.
type taskRun struct {
	r     *runner
	t     Task
	res   *Result
	sb    string    // the leased sandbox
	start time.Time // DELTABOX_TASK_START
	// floor is the checkpoint a failed task rolls back to: the first one since the last
	// commit ("" after a commit, until the next step's checkpoint).
	floor string
	// at is the checkpoint the sandbox is known to equal (just taken or rolled back to), ""
	// once a command ran since.
	at string
	// pending says steps ran since the last commit.
	pending bool
}

// runTask runs one task from lease to release and returns its result.
func runTask(ctx context.Context, r *runner, t Task) Result {
	ctx = r.logger(ctx, t)
	res := Result{Index: t.Index, ID: t.ID, Line: t.Line, Seed: TaskSeed(r.p.SeedValue(), t.Index), Steps: []StepResult{}}
	tr := &taskRun{r: r, t: t, res: &res, start: time.Now()}
	switch {
	case t.Err != nil:
		res.Status, res.Error = StatusFailed, t.Err.Error()
	case ctx.Err() != nil:
		res.Status, res.Error = StatusInterrupted, ctx.Err().Error()
	default:
		tr.run(ctx)
	}
	res.DurationMS = msSince(tr.start)
	log.L(ctx).Debug("task ended", "status", res.Status, "sandbox", res.Sandbox, "attempts", res.Attempts,
		"rollbacks", res.Rollbacks, "duration_ms", res.DurationMS, "error", res.Error)
	return res
}

// run leases a sandbox, runs the steps and ends the task.
func (tr *taskRun) run(ctx context.Context) {
	if err := tr.lease(ctx); err != nil {
		tr.end(ctx, err)
		return
	}
	ctx = log.With(ctx, "sandbox", tr.sb)
	err := tr.copyFiles(ctx)
	if err == nil {
		err = tr.steps(ctx)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err = tr.settle(cctx, err)
	tr.res.Effects = tr.effects(cctx)
	if rerr := tr.r.c.Release(cctx, tr.sb); rerr != nil {
		log.L(ctx).Warn("release failed", "error", rerr)
		err = errors.Join(err, fmt.Errorf("release sandbox %s: %w", tr.sb, rerr))
	}
	tr.end(ctx, err)
}

// end sets the task's status from the error that ended it.
func (tr *taskRun) end(ctx context.Context, err error) {
	switch {
	case err == nil:
		tr.res.Status = StatusSucceeded
	case ctx.Err() != nil:
		tr.res.Status, tr.res.Error = StatusInterrupted, err.Error()
	default:
		tr.res.Status, tr.res.Error = StatusFailed, err.Error()
	}
}

// leaseEnv is the environment every command of the task sees.
func (tr *taskRun) leaseEnv() []string {
	env := append(tr.t.Env(), randomEnv(tr.res.Seed, tr.start)...)
	return append(env, "DELTABOX_TASK_INDEX="+strconv.Itoa(tr.t.Index), "DELTABOX_TASK_ID="+tr.t.ID,
		"DELTABOX_PIPELINE="+tr.r.p.DisplayName())
}

// lease takes a sandbox from the pipeline's pool, waiting while the pool is at its max.
func (tr *taskRun) lease(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, tr.r.opts.LeaseTimeout)
	defer cancel()
	req := api.LeaseRequest{Env: tr.leaseEnv(), Labels: map[string]string{
		"deltabox.pipeline": tr.r.p.DisplayName(), "deltabox.task": strconv.Itoa(tr.t.Index)}}
	maps.Copy(req.Labels, tr.r.opts.Labels)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		l, err := tr.r.c.Lease(ctx, tr.r.p.Pool, req)
		if err == nil {
			tr.sb, tr.res.Sandbox = l.ID, l.ID
			return nil
		}
		if !errdefs.IsUnavailable(err) {
			return fmt.Errorf("lease from pool %q: %w", tr.r.p.Pool, err)
		}
		if _, perr := tr.r.c.Pool(ctx, tr.r.p.Pool); perr != nil {
			return fmt.Errorf("lease from pool %q: %w", tr.r.p.Pool, err)
		}
		if err := sleep(ctx, wait); err != nil {
			return fmt.Errorf("lease from pool %q (waiting for a sandbox): %w", tr.r.p.Pool, err)
		}
	}
}

// steps runs the pipeline's steps in order until one fails the task.
func (tr *taskRun) steps(ctx context.Context) error {
	for _, s := range tr.r.p.Steps {
		if err := tr.step(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// settle ends the task's effects: a task that succeeded commits what is still held; one that
// failed rolls back to the first checkpoint since the last commit, dropping held effects.
func (tr *taskRun) settle(ctx context.Context, err error) error {
	if err == nil {
		if tr.pending {
			return tr.commit(ctx)
		}
		return nil
	}
	if tr.floor != "" && tr.at != tr.floor {
		if rerr := tr.rollback(ctx, tr.floor); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	return err
}

// effects counts the sandbox's effects by status (zero counts if they cannot be listed).
func (tr *taskRun) effects(ctx context.Context) EffectCounts {
	effects, err := tr.r.c.Effects(ctx, tr.sb, "")
	if err != nil {
		log.L(ctx).Warn("cannot list effects", "error", err)
		return EffectCounts{}
	}
	return countEffects(effects)
}

// checkpoint takes the checkpoint a step starts from.
func (tr *taskRun) checkpoint(ctx context.Context, s *Step) (string, error) {
	msg := fmt.Sprintf("pipeline %s task %d (%s) step %s seed %d", tr.r.p.DisplayName(), tr.t.Index, tr.t.ID, s.Name, tr.res.Seed)
	t0 := time.Now()
	ck, err := tr.r.c.Checkpoint(ctx, tr.sb, api.CheckpointRequest{Level: s.Checkpoint, Message: msg})
	if err != nil {
		return "", fmt.Errorf("checkpoint before step %q: %w", s.Name, err)
	}
	tr.res.checkpointMS = append(tr.res.checkpointMS, msSince(t0))
	tr.res.Checkpoints++
	if tr.floor == "" {
		tr.floor = ck.ID
	}
	tr.at, tr.pending = ck.ID, true
	return ck.ID, nil
}

// rollback returns the sandbox to checkpoint ck.
func (tr *taskRun) rollback(ctx context.Context, ck string) error {
	t0 := time.Now()
	res, err := tr.r.c.Rollback(ctx, tr.sb, api.RollbackRequest{To: ck})
	if err != nil {
		return fmt.Errorf("roll back to checkpoint %s: %w", ck, err)
	}
	tr.res.rollbackMS = append(tr.res.rollbackMS, msSince(t0))
	tr.res.Rollbacks++
	tr.at = ck
	log.L(ctx).Debug("rolled back", "checkpoint", ck, "files", res.FilesRestored, "ops", res.OpsUndone,
		"effects_dropped", res.EffectsDropped)
	return nil
}

// commit releases the sandbox's held effects.
func (tr *taskRun) commit(ctx context.Context) error {
	res, err := tr.r.c.Commit(ctx, tr.sb)
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	tr.res.Commits++
	tr.floor, tr.pending = "", false
	if res.EffectsFailed > 0 {
		return fmt.Errorf("commit at checkpoint %s: %d effects failed to send: %w", res.Checkpoint, res.EffectsFailed, errdefs.ErrUnavailable)
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
