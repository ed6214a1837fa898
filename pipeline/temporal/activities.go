package temporal

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"go.temporal.io/sdk/activity"
	sdktemporal "go.temporal.io/sdk/temporal"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/client"
	"github.com/deltabox/deltabox/pipeline"
)

// Labels on the sandboxes a worker leases: a worker that starts releases the ones an
// earlier run of it left (their tasks moved on when it stopped).
const (
	labelEngine = "deltabox.engine"
	labelWorker = "deltabox.worker"
)

// Activities are the units of a task's work, run by the node that holds its sandbox
// through the node's own API.
type Activities struct {
	C *client.Client
	// Node is this daemon's node ID; Instance names this run of the worker.
	Node, Instance string
}

// register adds the activities to r under their names.
func (a *Activities) register(r interface {
	RegisterActivityWithOptions(any, activity.RegisterOptions)
}) {
	for name, fn := range map[string]any{
		actAcquire: a.Acquire, actAttempt: a.Attempt, actRollback: a.Rollback,
		actCommit: a.Commit, actFailover: a.FailoverPoint, actRelease: a.Release, actRemoveSnapshots: a.RemoveSnapshots,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}

// heartbeat records heartbeats until the returned function is called, so that the server
// notices a dead node and delivers a cancellation to a live one.
func heartbeat(ctx context.Context) func() {
	every := activity.GetInfo(ctx).HeartbeatTimeout / 3
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				activity.RecordHeartbeat(ctx)
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { close(done) }
}

// errNodeStopping is the type of the error of an activity cut short because its worker
// (the daemon) stops: the workflow treats it as the node lost.
const errNodeStopping = "node_stopping"

// errDeadline is the type of a daemon call that ran out of its deadline.
const errDeadline = "deadline_exceeded"

// failure turns a daemon error into a non-retryable activity error of its class.
func failure(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	stopping := ctx.Err() != nil // cancelled: the worker stops, or the workflow gave up on it
	select {
	case <-activity.GetWorkerStopChannel(ctx):
		stopping = true
	default:
	}
	// A cancellation while the activity's own context is live comes from the daemon, which
	// cancels what runs in it when it stops, before its worker's stop is seen here (seen in
	// TestScaleOutTemporal: a checkpoint on a node told to stop came back "context canceled"
	// and failed its task instead of failing it over).
	stopping = stopping || errors.Is(err, context.Canceled)
	if stopping {
		return sdktemporal.NewNonRetryableApplicationError("the node is stopping: "+err.Error(), errNodeStopping, err)
	}
	kind := "internal"
	switch {
	case errdefs.IsNotFound(err):
		kind = "not_found"
	case errdefs.IsInvalidArgument(err):
		kind = "invalid_argument"
	case errdefs.IsUnavailable(err):
		kind = "unavailable"
	case errdefs.IsFailedPrecondition(err):
		kind = "failed_precondition"
	case errors.Is(err, context.DeadlineExceeded):
		// Typed like every other failure of the activities (an untyped one is the worker's,
		// see nodeLost), and retryable: the cleanup activity tries again.
		return sdktemporal.NewApplicationError(err.Error(), errDeadline, err)
	}
	return sdktemporal.NewNonRetryableApplicationError(err.Error(), kind, err)
}

// parse rebuilds the pipeline and the task from a workflow's input.
func (in TaskInput) parse() (*pipeline.Pipeline, pipeline.Task, error) {
	p, err := pipeline.ParseBundle(in.Pipeline)
	if err != nil {
		return nil, pipeline.Task{}, err
	}
	return p, pipeline.TaskFromLine(in.TasksSource, in.Index, in.Line, in.Raw), nil
}

// Acquire takes the task's sandbox on this node: it restores the failover point when there
// is one, else leases from the pipeline's pool (waiting while it is at its max) and copies
// the pipeline's files in.
func (a *Activities) Acquire(ctx context.Context, in AcquireInput) (Acquired, error) {
	defer heartbeat(ctx)()
	p, t, err := in.Task.parse()
	if err != nil {
		return Acquired{}, failure(ctx, err)
	}
	if in.Snapshot != "" {
		id, err := a.restore(ctx, in.Snapshot, p.Pool, in.Task.LeaseTimeout)
		if err != nil {
			return Acquired{}, failure(ctx, fmt.Errorf("restore failover point %s into pool %q: %w", in.Snapshot, p.Pool, err))
		}
		return Acquired{Sandbox: id, Node: a.Node}, nil
	}
	sb := &pipeline.Sandbox{C: a.C, P: p, T: t, Start: in.Start,
		Labels: map[string]string{labelEngine: "temporal", labelWorker: a.Instance}}
	if err := sb.Lease(ctx, in.Task.LeaseTimeout); err != nil {
		if sb.ID != "" {
			_ = a.C.Release(context.WithoutCancel(ctx), sb.ID)
		}
		return Acquired{}, failure(ctx, err)
	}
	return Acquired{Sandbox: sb.ID, Node: a.Node}, nil
}

// restore restores a snapshot into pool, waiting up to timeout while the pool is at its max
// (as a lease does).
func (a *Activities) restore(ctx context.Context, uri, pool string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		l, err := a.C.RestoreWith(ctx, api.RestoreRequest{URI: uri, Pool: pool, AdoptHeldEffects: true}, nil)
		if err == nil {
			return l.ID, nil
		}
		if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "at its max") {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w (waited %s for a free slot)", err, timeout)
		case <-time.After(wait):
		}
	}
}

// checkpoint takes the checkpoint a step starts from.
func (a *Activities) checkpoint(ctx context.Context, sandbox string, in CheckpointInput) (Checkpointed, error) {
	t0 := time.Now()
	ck, err := a.C.Checkpoint(ctx, sandbox, api.CheckpointRequest{Level: in.Level, Message: in.Message})
	if err != nil {
		return Checkpointed{}, failure(ctx, fmt.Errorf("checkpoint: %w", err))
	}
	return Checkpointed{ID: ck.ID, MS: pipeline.Ms(time.Since(t0))}, nil
}

// Attempt runs one attempt of a step. A failed command is a result, not an error: the
// workflow applies the step's retry and failure rules. Cancelling the activity (the
// workflow was cancelled, or the server saw no heartbeat) cancels the exec, which kills
// the command.
func (a *Activities) Attempt(ctx context.Context, in AttemptInput) (AttemptResult, error) {
	defer heartbeat(ctx)()
	p, t, err := in.Task.parse()
	if err != nil {
		return AttemptResult{}, failure(ctx, err)
	}
	s, fb := p.StepAt(in.Step)
	if in.Fallback {
		s = fb
	}
	if s == nil {
		return AttemptResult{}, failure(ctx, fmt.Errorf("step %d (fallback %t) is not in the pipeline: %w", in.Step, in.Fallback, errdefs.ErrInvalidArgument))
	}
	var out AttemptResult
	if in.Checkpoint != nil {
		if out.Checkpoint, err = a.checkpoint(ctx, in.Sandbox, *in.Checkpoint); err != nil {
			return out, err
		}
	}
	sb := &pipeline.Sandbox{C: a.C, P: p, T: t, ID: in.Sandbox, Start: in.Start}
	if err := sb.Attempt(ctx, s, in.Attempt); err != nil {
		if ctx.Err() != nil {
			return out, failure(ctx, ctx.Err())
		}
		out.Error = err.Error()
	}
	return out, nil
}

// Rollback returns the sandbox to a checkpoint and reports the round trip (ms).
func (a *Activities) Rollback(ctx context.Context, in RollbackInput) (float64, error) {
	defer heartbeat(ctx)()
	t0 := time.Now()
	if _, err := a.C.Rollback(ctx, in.Sandbox, api.RollbackRequest{To: in.Checkpoint}); err != nil {
		return 0, failure(ctx, err)
	}
	return pipeline.Ms(time.Since(t0)), nil
}

// Commit releases the sandbox's held effects (each with its Idempotency-Key).
func (a *Activities) Commit(ctx context.Context, sandbox string) (Committed, error) {
	defer heartbeat(ctx)()
	res, err := a.C.Commit(ctx, sandbox)
	if err != nil {
		return Committed{}, failure(ctx, err)
	}
	return Committed{Checkpoint: res.Checkpoint, EffectsFailed: res.EffectsFailed}, nil
}

// FailoverPoint pushes an L3 snapshot of the sandbox to the daemon's object store (shared
// by the fleet) and returns its URI.
func (a *Activities) FailoverPoint(ctx context.Context, sandbox string) (string, error) {
	defer heartbeat(ctx)()
	snap, err := a.C.SnapshotPush(ctx, sandbox, "", nil)
	if err != nil {
		return "", failure(ctx, fmt.Errorf("push failover point of %s: %w", sandbox, err))
	}
	return snap.URI, nil
}

// Release counts the sandbox's effects and returns it to its pool.
func (a *Activities) Release(ctx context.Context, sandbox string) (Released, error) {
	defer heartbeat(ctx)()
	sb := &pipeline.Sandbox{C: a.C, ID: sandbox}
	out := Released{Effects: sb.CountEffects(ctx)}
	if err := a.C.Release(ctx, sandbox); err != nil && !errdefs.IsNotFound(err) {
		return out, failure(ctx, err)
	}
	return out, nil
}

// RemoveSnapshots deletes a finished task's failover points from the shared store.
func (a *Activities) RemoveSnapshots(ctx context.Context, uris []string) error {
	var errs []error
	for _, u := range uris {
		if err := a.C.SnapshotRemove(ctx, u); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return failure(ctx, errors.Join(errs...))
}
