package temporal

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/stretchr/testify/mock"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	sdktemporal "go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/deltabox/deltabox/pipeline"
)

// fakeNode plays the activities of the nodes: attempts fail as fail says, and a node can be
// lost once at a given attempt of a given step.
type fakeNode struct {
	mu       sync.Mutex
	released int
	fail     map[string]int // "step/attempt" -> 1: that attempt fails
	loseAt   string         // "step/attempt": the node goes away there (once)
	pushErr  []error        // the failover pushes' errors, in order (then they succeed)
	pushes   int
	acquires []AcquireInput
	commits  int
	attempts []string
}

func (f *fakeNode) register(env *testsuite.TestWorkflowEnvironment) {
	env.OnActivity(actAcquire, mock.Anything, mock.Anything).Return(func(_ context.Context, in AcquireInput) (Acquired, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.acquires = append(f.acquires, in)
		n := len(f.acquires)
		return Acquired{Sandbox: fmt.Sprintf("sb-%d", n), Node: fmt.Sprintf("node-%d", n)}, nil
	})
	env.OnActivity(actAttempt, mock.Anything, mock.Anything).Return(func(_ context.Context, in AttemptInput) (AttemptResult, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		k := fmt.Sprintf("%d%s/%d", in.Step, map[bool]string{true: "fb"}[in.Fallback], in.Attempt)
		f.attempts = append(f.attempts, k)
		var out AttemptResult
		if in.Checkpoint != nil {
			out.Checkpoint = Checkpointed{ID: "ck", MS: 1}
		}
		if k == f.loseAt {
			f.loseAt = ""
			return out, sdktemporal.NewNonRetryableApplicationError("the node is stopping", errNodeStopping, nil)
		}
		if f.fail[k] > 0 {
			out.Error = "command exit code 3"
		}
		return out, nil
	})
	env.OnActivity(actRollback, mock.Anything, mock.Anything).Return(float64(1), nil)
	env.OnActivity(actCommit, mock.Anything, mock.Anything).Return(func(_ context.Context, _ string) (Committed, error) {
		f.mu.Lock()
		f.commits++
		f.mu.Unlock()
		return Committed{Checkpoint: "ck"}, nil
	})
	env.OnActivity(actFailover, mock.Anything, mock.Anything).Return(func(_ context.Context, sb string) (string, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.pushes++
		if f.pushes <= len(f.pushErr) && f.pushErr[f.pushes-1] != nil {
			return "", f.pushErr[f.pushes-1]
		}
		return fmt.Sprintf("s3://b#%s-%d", sb, f.pushes), nil
	})
	env.OnActivity(actRelease, mock.Anything, mock.Anything).Return(func(context.Context, string) (Released, error) {
		f.mu.Lock()
		f.released++
		f.mu.Unlock()
		return Released{Effects: pipeline.EffectCounts{Committed: 1}}, nil
	})
	env.OnActivity(actRemoveSnapshots, mock.Anything, mock.Anything).Return(nil)
}

func runTask(t *testing.T, yaml string, f *fakeNode) pipeline.Result {
	return runTaskWith(t, yaml, f, nil)
}

func runTaskWith(t *testing.T, yaml string, f *fakeNode, setup func(*testsuite.TestWorkflowEnvironment)) pipeline.Result {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetWorkerOptions(worker.Options{EnableSessionWorker: true})
	env.RegisterWorkflow(TaskWorkflow)
	(&Activities{}).register(env)
	f.register(env)
	if setup != nil {
		setup(env)
	}
	p, err := pipeline.Parse("p.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	env.ExecuteWorkflow(TaskWorkflow, TaskInput{Pipeline: p.Bundle(), TasksSource: "tasks", Index: 0, Line: 1, Raw: `{"id": "a"}`,
		Queue: "q", NodeTimeout: 3 * time.Second, LeaseTimeout: time.Minute, MaxFailovers: 3})
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("workflow: completed %t, error %v", env.IsWorkflowCompleted(), env.GetWorkflowError())
	}
	var out TaskOutput
	if err := env.GetWorkflowResult(&out); err != nil {
		t.Fatal(err)
	}
	return out.Result
}

// The local engine's rules inside the workflow: a failed attempt is rolled back and retried,
// a step that fails for good falls back, effects are committed once at the end.
func TestWorkflowRetryFallbackCommit(t *testing.T) {
	f := &fakeNode{fail: map[string]int{"0/1": 1, "1/1": 1, "1/2": 1}}
	res := runTask(t, `pool: bb
steps:
  - {name: a, run: [a], retry: {attempts: 2, backoff: 1s}}
  - {name: b, run: [b], retry: {attempts: 2}, on_failure: {fallback: c}}
fallbacks:
  - {name: c, run: [c]}
`, f)
	if res.Status != pipeline.StatusSucceeded || res.Attempts != 5 || res.Failures != 3 || res.Rollbacks != 3 || res.Commits != 1 {
		t.Fatalf("result %+v", res)
	}
	if len(res.Steps) != 3 || res.Steps[1].Status != pipeline.StatusRecovered || res.Steps[2].FallbackFor != "b" {
		t.Fatalf("steps %+v", res.Steps)
	}
	if res.Node != "node-1" || res.Failovers != 0 || f.commits != 1 {
		t.Fatalf("node %s failovers %d commits %d", res.Node, res.Failovers, f.commits)
	}
}

// A node lost in step c continues on another node from the failover point after step b:
// the restore gets that snapshot, a and b do not run again, the effects are committed once
// (after a failover point, as every commit of a pipeline with failover points).
func TestWorkflowFailsOverFromTheLastPoint(t *testing.T) {
	f := &fakeNode{loseAt: "2/1"}
	res := runTask(t, `pool: bb
steps:
  - {name: a, run: [a]}
  - {name: b, run: [b], failover: l3}
  - {name: c, run: [c]}
`, f)
	if res.Status != pipeline.StatusSucceeded || res.Failovers != 1 || res.Node != "node-2" || len(res.Nodes) != 2 {
		t.Fatalf("result %+v", res)
	}
	if len(f.acquires) != 2 || f.acquires[0].Snapshot != "" || f.acquires[1].Snapshot != "s3://b#sb-1-1" {
		t.Fatalf("acquires %+v", f.acquires)
	}
	if want := "[0/1 1/1 2/1 2/1]"; fmt.Sprint(f.attempts) != want {
		t.Fatalf("attempts %v, want %s (a and b once)", f.attempts, want)
	}
	if len(res.Steps) != 3 || f.commits != 1 {
		t.Fatalf("steps %+v, commits %d", res.Steps, f.commits)
	}
}

// A push whose failure the worker made up around the activity (an untyped error: here the
// "context canceled" a stopping worker reports when it cannot send a finished activity's
// result) is the node lost: the task continues elsewhere from its last failover point and
// commits once. A typed failure of the push (the daemon's error) fails the task.
func TestWorkflowUntypedActivityFailureIsTheNodeLost(t *testing.T) {
	yaml := "pool: bb\nsteps:\n  - {name: a, run: [a], failover: l3}\n  - {name: b, run: [b]}\n"
	// The second push is the commit's, after step b.
	f := &fakeNode{pushErr: []error{nil, errors.New("context canceled")}}
	res := runTask(t, yaml, f)
	if res.Status != pipeline.StatusSucceeded || res.Failovers != 1 || len(f.acquires) != 2 || f.commits != 1 {
		t.Fatalf("result %+v, acquires %+v, commits %d", res, f.acquires, f.commits)
	}
	if f.acquires[1].Snapshot != "s3://b#sb-1-1" {
		t.Fatalf("restored from %q, want the failover point after step a", f.acquires[1].Snapshot)
	}
	if want := "[0/1 1/1 1/1]"; fmt.Sprint(f.attempts) != want {
		t.Fatalf("attempts %v, want %s (a once)", f.attempts, want)
	}
	f = &fakeNode{pushErr: []error{nil, sdktemporal.NewNonRetryableApplicationError("push failover point of sb-1: disk full", "internal", nil)}}
	res = runTask(t, yaml, f)
	if res.Status != pipeline.StatusFailed || res.Failovers != 0 || len(f.acquires) != 1 || f.commits != 0 || !strings.Contains(res.Error, "disk full") {
		t.Fatalf("typed push failure: result %+v, acquires %d, commits %d", res, len(f.acquires), f.commits)
	}
}

// Without a failover point a lost task starts again from a fresh lease.
func TestWorkflowFailsOverFromTheStart(t *testing.T) {
	f := &fakeNode{loseAt: "1/1"}
	res := runTask(t, "pool: bb\nsteps:\n  - {name: a, run: [a]}\n  - {name: b, run: [b]}\n", f)
	if res.Status != pipeline.StatusSucceeded || res.Failovers != 1 || len(f.acquires) != 2 || f.acquires[1].Snapshot != "" {
		t.Fatalf("result %+v acquires %+v", res, f.acquires)
	}
	if want := "[0/1 1/1 0/1 1/1]"; fmt.Sprint(f.attempts) != want {
		t.Fatalf("attempts %v, want %s", f.attempts, want)
	}
}

// A task whose workflow is cancelled (here while it waits out a retry's backoff) still rolls
// back and releases its sandbox, and ends interrupted.
func TestWorkflowCancelReleases(t *testing.T) {
	f := &fakeNode{fail: map[string]int{"0/1": 1}}
	yaml := "pool: bb\nsteps:\n  - {name: a, run: [a], retry: {attempts: 2, backoff: 1h}}\n"
	res := runTaskWith(t, yaml, f, func(env *testsuite.TestWorkflowEnvironment) {
		env.RegisterDelayedCallback(env.CancelWorkflow, time.Minute)
	})
	if res.Status != pipeline.StatusInterrupted || f.released != 1 || res.Rollbacks != 1 {
		t.Fatalf("result %+v, released %d times", res, f.released)
	}
}

// A session whose node went away while making it (heartbeat timeout, cancellation) is a lost
// node, tried again elsewhere; one no node took within the lease timeout is not.
func TestSessionNodeLost(t *testing.T) {
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{sdktemporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_HEARTBEAT, nil), true},
		{fmt.Errorf("activity error: %w", sdktemporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_HEARTBEAT, nil)), true},
		{sdktemporal.NewCanceledError(), true},
		{sdktemporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil), false},
		{fmt.Errorf("something else"), false},
	} {
		if got := sessionNodeLost(c.err); got != c.lost {
			t.Errorf("sessionNodeLost(%v) = %v, want %v", c.err, got, c.lost)
		}
	}
}

// TestFailureClassifiesTheDaemonsCancellation: an activity whose daemon call comes back
// cancelled while the activity's own context is live (the daemon stops) reports the node as
// stopping, which the workflow fails over from; other errors keep their class.
func TestFailureClassifiesTheDaemonsCancellation(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	classify := func(ctx context.Context, kind string) error {
		errs := map[string]error{
			"canceled":  fmt.Errorf("checkpoint: %w", context.Canceled),
			"deadline":  fmt.Errorf("checkpoint: %w", context.DeadlineExceeded),
			"not_found": fmt.Errorf("sandbox: %w", errdefs.ErrNotFound),
		}
		return failure(ctx, errs[kind])
	}
	env.RegisterActivityWithOptions(classify, activity.RegisterOptions{Name: "classify"})
	for kind, want := range map[string]string{"canceled": errNodeStopping, "not_found": "not_found"} {
		_, err := env.ExecuteActivity("classify", kind)
		var ae *sdktemporal.ApplicationError
		if !errors.As(err, &ae) || ae.Type() != want || !ae.NonRetryable() {
			t.Errorf("%s: %v, want a non-retryable %s", kind, err, want)
		}
	}
	_, err := env.ExecuteActivity("classify", "deadline")
	var ae *sdktemporal.ApplicationError
	if !errors.As(err, &ae) || ae.Type() != errDeadline || ae.NonRetryable() {
		t.Errorf("a deadline inside the daemon: %v, want a retryable %s (not the node stopping, and typed: an untyped failure is the worker's)", err, errDeadline)
	}
}
