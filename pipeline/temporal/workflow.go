package temporal

import (
	"errors"
	"fmt"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	sdktemporal "go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/deltabox/deltabox/pipeline"
)

// sessionLifetime bounds how long one node may hold a task.
const sessionLifetime = 7 * 24 * time.Hour

// errNodeLost wraps the error of an activity whose node stopped answering.
type errNodeLost struct {
	node string
	err  error
}

func (e *errNodeLost) Error() string { return fmt.Sprintf("node %s lost: %v", e.node, e.err) }
func (e *errNodeLost) Unwrap() error { return e.err }

// mark is where a task that lost its node starts again: a failover point (an L3 snapshot
// in the shared store) with the task's progress when it was pushed, or the start.
type mark struct {
	uri        string // "" = the start (a fresh lease)
	next       int    // the next step to run
	pending    bool   // effects held (committed by the next commit)
	res        pipeline.Result
	ckMS, rbMS []float64
}

// taskFlow is one task's workflow in progress; its fields mirror the local engine's task run.
type taskFlow struct {
	root  workflow.Context
	s     workflow.Context // the session: every activity runs on the node holding the sandbox
	in    TaskInput
	p     *pipeline.Pipeline
	t     pipeline.Task
	start time.Time
	res   pipeline.Result
	sb    string
	node  string
	floor string // the first checkpoint since the last commit
	at    string // the checkpoint the sandbox equals ("" once a command ran since)
	// pending says steps ran since the last commit; committing says a commit was sent
	// since the last failover point (so running the steps again could repeat effects).
	pending, committing bool
	next                int
	mark                mark
	snapshots           []string // failover points pushed, removed at the end
	ckMS, rbMS          []float64
}

// TaskWorkflow runs one task of a pipeline: it takes a sandbox on a node with capacity (a
// session), runs the steps there with the local engine's checkpoint, retry, rollback and
// commit rules, and when the node is lost starts again on another node from the last
// failover point.
func TaskWorkflow(ctx workflow.Context, in TaskInput) (TaskOutput, error) {
	p, err := pipeline.ParseBundle(in.Pipeline)
	if err != nil {
		return TaskOutput{}, sdktemporal.NewNonRetryableApplicationError(err.Error(), "invalid_argument", err)
	}
	t := pipeline.TaskFromLine(in.TasksSource, in.Index, in.Line, in.Raw)
	w := &taskFlow{root: ctx, in: in, p: p, t: t, start: workflow.Now(ctx)}
	w.res = pipeline.Result{Index: t.Index, ID: t.ID, Line: t.Line, Seed: pipeline.TaskSeed(p.SeedValue(), t.Index),
		Steps: []pipeline.StepResult{}}
	w.mark = w.save("")
	moves := 0
	for {
		err = w.onNode()
		var lost *errNodeLost
		if !errors.As(err, &lost) || ctx.Err() != nil {
			break
		}
		if w.committing && w.mark.uri == "" {
			err = fmt.Errorf("%w; effects may have been committed there and the pipeline has no failover point to resume from, so the task is not run again", err)
			break
		}
		if moves++; moves > in.MaxFailovers {
			err = fmt.Errorf("%w (after %d failovers)", err, w.res.Failovers)
			break
		}
		workflow.GetLogger(ctx).Warn("node lost; failing over", "node", lost.node, "from", w.mark.uri, "error", lost.err)
		w.restore(lost.node != "")
	}
	w.end(err)
	w.cleanup()
	w.res.DurationMS = pipeline.Ms(workflow.Now(ctx).Sub(w.start))
	return TaskOutput{Result: w.res, CheckpointMS: w.ckMS, RollbackMS: w.rbMS}, nil
}

// save records the task's progress as the mark at failover point uri.
func (w *taskFlow) save(uri string) mark {
	res := w.res
	res.Steps = slices.Clone(w.res.Steps)
	return mark{uri: uri, next: w.next, pending: w.pending, res: res,
		ckMS: slices.Clone(w.ckMS), rbMS: slices.Clone(w.rbMS)}
}

// restore puts the task back at its mark, keeping where it ran and how often it moved
// (ran: it held a sandbox on the lost node; else it only moves to another node's queue).
func (w *taskFlow) restore(ran bool) {
	nodes, failovers := w.res.Nodes, w.res.Failovers
	if ran {
		failovers++
	}
	w.res = w.mark.res
	w.res.Steps = slices.Clone(w.mark.res.Steps)
	w.res.Nodes, w.res.Failovers = nodes, failovers
	w.next, w.pending, w.committing = w.mark.next, w.mark.pending, false
	w.ckMS, w.rbMS = slices.Clone(w.mark.ckMS), slices.Clone(w.mark.rbMS)
	w.sb, w.node, w.floor, w.at = "", "", "", ""
}

// end sets the task's status from the error that ended it.
func (w *taskFlow) end(err error) {
	switch {
	case err == nil:
		w.res.Status, w.res.Error = pipeline.StatusSucceeded, ""
	case w.root.Err() != nil:
		w.res.Status, w.res.Error = pipeline.StatusInterrupted, err.Error()
	default:
		w.res.Status, w.res.Error = pipeline.StatusFailed, err.Error()
	}
}

// activityOptions apply to every activity: one attempt (the workflow decides what is
// retried), heartbeats so a dead node is noticed within NodeTimeout.
func (w *taskFlow) activityOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue: w.in.Queue,
		// A session's activities start at once on its node: one that waits is queued for
		// a worker that is gone (a session can outlive its worker when the worker stops
		// while the session is being created), which counts as the node lost.
		ScheduleToStartTimeout: max(2*w.in.NodeTimeout, 10*time.Second),
		StartToCloseTimeout:    sessionLifetime,
		HeartbeatTimeout:       w.in.NodeTimeout,
		RetryPolicy:            &sdktemporal.RetryPolicy{MaximumAttempts: 1},
	})
}

// onNode runs the task on one node: session, sandbox, steps from w.next, settle, release.
func (w *taskFlow) onNode() error {
	ctx := w.activityOptions(w.root)
	s, err := workflow.CreateSession(ctx, &workflow.SessionOptions{
		CreationTimeout: w.in.LeaseTimeout, ExecutionTimeout: sessionLifetime, HeartbeatTimeout: w.in.NodeTimeout})
	if err != nil {
		if w.root.Err() == nil && sessionNodeLost(err) {
			// A node took the session and went away while making it (killed, or its worker
			// stopped): another node may take it.
			return &errNodeLost{err: fmt.Errorf("the node that took the task's session went away: %w", err)}
		}
		return fmt.Errorf("no node of task queue %q took the task within %s: %w", w.in.Queue, w.in.LeaseTimeout, err)
	}
	defer workflow.CompleteSession(s)
	w.s = s
	var acq Acquired
	if err := w.call(actAcquire, AcquireInput{Task: w.in, Start: w.start, Snapshot: w.mark.uri}, &acq); err != nil {
		return err
	}
	w.sb, w.node, w.res.Sandbox, w.res.Node = acq.Sandbox, acq.Node, acq.Sandbox, acq.Node
	w.res.Nodes = append(w.res.Nodes, acq.Node)
	err = w.settle(w.steps())
	var lost *errNodeLost
	if errors.As(err, &lost) {
		return err
	}
	var rel Released
	if rerr := w.call(actRelease, w.sb, &rel); rerr != nil {
		workflow.GetLogger(w.root).Warn("release failed", "sandbox", w.sb, "node", w.node, "error", rerr)
		if !errors.As(rerr, &lost) {
			err = errors.Join(err, fmt.Errorf("release sandbox %s: %w", w.sb, rerr))
		}
	}
	w.res.Effects = rel.Effects
	return err
}

// call runs an activity in the session; a failure caused by the node going away is an
// *errNodeLost.
func (w *taskFlow) call(name string, in, out any) error {
	ctx := w.s
	if w.root.Err() != nil { // cancelled: the cleanup (rollback, release) still runs
		ctx, _ = workflow.NewDisconnectedContext(w.s)
	}
	err := workflow.ExecuteActivity(ctx, name, in).Get(ctx, out)
	if err != nil && w.root.Err() == nil && nodeLost(w.s, err) {
		return &errNodeLost{node: w.node, err: err}
	}
	return err
}

// sessionNodeLost reports whether a failed session creation says the node that took it went
// away (its creation activity stopped heartbeating or was cancelled), rather than that no
// node took it in time (a schedule-to-start timeout: the task's lease timeout).
func sessionNodeLost(err error) bool {
	var te *sdktemporal.TimeoutError
	if errors.As(err, &te) {
		return te.TimeoutType() == enumspb.TIMEOUT_TYPE_HEARTBEAT
	}
	var ce *sdktemporal.CanceledError
	return errors.As(err, &ce)
}

// nodeLost reports whether err says the session's worker is gone rather than the activity
// failed.
func nodeLost(s workflow.Context, err error) bool {
	if errors.Is(err, workflow.ErrSessionFailed) {
		return true
	}
	if info := workflow.GetSessionInfo(s); info != nil && info.SessionState == workflow.SessionStateFailed {
		return true
	}
	var te *sdktemporal.TimeoutError
	if errors.As(err, &te) {
		switch te.TimeoutType() {
		case enumspb.TIMEOUT_TYPE_HEARTBEAT, enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START:
			return true
		}
	}
	var ce *sdktemporal.CanceledError
	if errors.As(err, &ce) {
		return true
	}
	// An untyped application failure is a plain Go error that crossed the SDK: the
	// activities return only typed ones (failure), so it came from the worker around the
	// activity. Seen in TestScaleOutTemporal: a stopping worker could not send a finished
	// push's result (its post-processing ran on the worker's cancelled context) and
	// reported "context canceled" as the activity's failure instead. A panic in an
	// activity is typed (PanicError): a failure, not a lost node.
	var ae *sdktemporal.ApplicationError
	return errors.As(err, &ae) && (ae.Type() == errNodeStopping || ae.Type() == "")
}

// steps runs the pipeline's steps from w.next, committing after steps with commit: step and
// pushing failover points where the pipeline asks for them.
func (w *taskFlow) steps() error {
	for i := w.next; i < len(w.p.Steps); i++ {
		done, err := w.step(i)
		if err != nil {
			return err
		}
		w.next = i + 1
		switch {
		case done != nil && done.Commit == pipeline.CommitStep:
			err = w.commit()
		case w.p.FailoverAfter(i):
			err = w.failoverPoint()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// settle ends the task's effects as the local engine does: commit what is held after
// success, roll back to the floor after a failure.
func (w *taskFlow) settle(err error) error {
	var lost *errNodeLost
	if errors.As(err, &lost) {
		return err
	}
	if err == nil {
		if w.pending {
			return w.commit()
		}
		return nil
	}
	if w.floor != "" && w.at != w.floor {
		if rerr := w.rollback(w.floor); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	return err
}

// commit releases the held effects. A pipeline with failover points pushes one first, so
// that a node lost during the commit is followed by the same commit (same effects, same
// Idempotency-Keys) from the snapshot, never by a second run of the steps.
func (w *taskFlow) commit() error {
	if w.p.HasFailover() {
		if err := w.failoverPoint(); err != nil {
			return err
		}
	}
	w.committing = true
	var c Committed
	if err := w.call(actCommit, w.sb, &c); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	w.res.Commits++
	w.floor, w.pending = "", false
	if c.EffectsFailed > 0 {
		return fmt.Errorf("commit at checkpoint %s: %d effects failed to send", c.Checkpoint, c.EffectsFailed)
	}
	return nil
}

// failoverPoint pushes an L3 snapshot of the sandbox to the shared store and makes it the
// task's mark.
func (w *taskFlow) failoverPoint() error {
	var uri string
	if err := w.call(actFailover, w.sb, &uri); err != nil {
		return fmt.Errorf("failover point after step %d: %w", w.next, err)
	}
	w.snapshots = append(w.snapshots, uri)
	w.mark = w.save(uri)
	return nil
}

// cleanup removes the task's failover points from the shared store (on any node).
func (w *taskFlow) cleanup() {
	if len(w.snapshots) == 0 {
		return
	}
	ctx, _ := workflow.NewDisconnectedContext(w.root) // also after a cancellation
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue: w.in.Queue, StartToCloseTimeout: time.Minute, ScheduleToCloseTimeout: 10 * time.Minute,
		RetryPolicy: &sdktemporal.RetryPolicy{MaximumAttempts: 3}})
	if err := workflow.ExecuteActivity(ctx, actRemoveSnapshots, w.snapshots).Get(ctx, nil); err != nil {
		workflow.GetLogger(w.root).Warn("cannot remove failover points", "snapshots", w.snapshots, "error", err)
	}
}
