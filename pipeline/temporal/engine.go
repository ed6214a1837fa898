package temporal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/deltabox/deltabox/pipeline"
)

// RunOptions tune a run on Temporal.
type RunOptions struct {
	Conn
	Queue string // the shared task queue the nodes poll (default "deltabox")
	// Parallel is how many task workflows this run keeps in flight (the nodes' capacity
	// bounds how many run at once).
	Parallel int
	// Done, OnResult: as pipeline.Options.
	Done     map[int]pipeline.Result
	OnResult func(pipeline.Result) error
	// RunKey tells apart runs of the same pipeline and tasks ("": the same workflows).
	RunKey string
	// NodeTimeout: how long a silent node keeps its tasks (default 10 s); LeaseTimeout:
	// how long a task waits for a node with capacity (default 10 min); MaxFailovers:
	// how often a task may move (default 3).
	NodeTimeout, LeaseTimeout time.Duration
	MaxFailovers              int
}

// run is one run of a pipeline on Temporal.
type run struct {
	tc   client.Client
	p    *pipeline.Pipeline
	opts RunOptions
	key  string

	mu      sync.Mutex
	sum     pipeline.Summary
	sinkErr error
}

// Run runs every task as a workflow, at most opts.Parallel in flight, and returns the
// summary as pipeline.Run does. Workflow IDs are deterministic (pipeline, tasks, RunKey,
// task index): running the same command again waits for the workflows already running
// (or takes the results of finished ones) instead of starting them again. A cancelled ctx
// stops waiting; the workflows go on and the tasks are reported as interrupted.
func Run(ctx context.Context, p *pipeline.Pipeline, tasks []pipeline.Task, opts RunOptions) (pipeline.Summary, error) {
	start := time.Now()
	opts.defaults()
	r := &run{p: p, opts: opts, key: runKey(p, tasks, opts.Namespace+"\x00"+opts.Queue+"\x00"+opts.RunKey),
		sum: pipeline.NewSummary(p, len(tasks))}
	tc, err := Dial(ctx, opts.Conn)
	if err != nil {
		return r.sum, err
	}
	defer tc.Close()
	r.tc = tc
	r.work(ctx, r.sum.SkipDone(tasks, opts.Done))
	r.sum.Finish(start)
	return r.sum, r.sinkErr
}

func (o *RunOptions) defaults() {
	if o.Queue == "" {
		o.Queue = DefaultQueue
	}
	if o.Parallel < 1 {
		o.Parallel = 1
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = defaultNodeTTL
	}
	if o.LeaseTimeout <= 0 {
		o.LeaseTimeout = 10 * time.Minute
	}
	if o.MaxFailovers <= 0 {
		o.MaxFailovers = 3
	}
}

// runKey hashes what makes a run: the pipeline (and its files), the tasks and the key (the
// namespace, task queue and --run-key).
func runKey(p *pipeline.Pipeline, tasks []pipeline.Task, key string) string {
	h := sha256.New()
	b := p.Bundle()
	fmt.Fprintf(h, "%s\x00%d\x00%s\x00", b.YAML, len(b.Files), key)
	for src, data := range b.Files {
		h.Write([]byte(src))
		h.Write(data)
	}
	for _, t := range tasks {
		fmt.Fprintf(h, "%d\x00%s\n", t.Index, t.Raw)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

var idUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// WorkflowID is the deterministic ID of a task's workflow.
func (r *run) workflowID(t pipeline.Task) string {
	return "deltabox-" + idUnsafe.ReplaceAllString(r.p.DisplayName(), "_") + "-" + r.key + "-" + strconv.Itoa(t.Index)
}

// work runs the tasks opts.Parallel at a time until they end or ctx ends.
func (r *run) work(ctx context.Context, todo []pipeline.Task) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, r.opts.Parallel)
	var wg sync.WaitGroup
	for _, t := range todo {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			r.record(interrupted(t, ctx.Err()))
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if !r.record(r.task(ctx, t)) {
				cancel()
			}
		}()
	}
	wg.Wait()
}

func interrupted(t pipeline.Task, err error) pipeline.Result {
	return pipeline.Result{Index: t.Index, ID: t.ID, Line: t.Line, Status: pipeline.StatusInterrupted,
		Error: err.Error(), Steps: []pipeline.StepResult{}}
}

// task starts (or finds) a task's workflow and waits for its result.
func (r *run) task(ctx context.Context, t pipeline.Task) pipeline.Result {
	if t.Err != nil {
		return pipeline.Result{Index: t.Index, ID: t.ID, Line: t.Line, Status: pipeline.StatusFailed,
			Seed: pipeline.TaskSeed(r.p.SeedValue(), t.Index), Error: t.Err.Error(), Steps: []pipeline.StepResult{}}
	}
	wr, err := r.start(ctx, t)
	if err != nil {
		if ctx.Err() != nil {
			return interrupted(t, ctx.Err())
		}
		return r.failed(t, fmt.Errorf("start workflow: %w", err))
	}
	var out TaskOutput
	if err := wr.Get(ctx, &out); err != nil {
		if ctx.Err() != nil {
			return interrupted(t, fmt.Errorf("%w (workflow %s goes on; run again to pick it up)", ctx.Err(), wr.GetID()))
		}
		return r.failed(t, fmt.Errorf("workflow %s: %w", wr.GetID(), err))
	}
	res := out.Result
	res.AddTimings(out.CheckpointMS, out.RollbackMS)
	return res
}

func (r *run) failed(t pipeline.Task, err error) pipeline.Result {
	return pipeline.Result{Index: t.Index, ID: t.ID, Line: t.Line, Status: pipeline.StatusFailed,
		Seed: pipeline.TaskSeed(r.p.SeedValue(), t.Index), Error: err.Error(), Steps: []pipeline.StepResult{}}
}

// start starts the task's workflow, or returns the one with its ID (running or finished).
func (r *run) start(ctx context.Context, t pipeline.Task) (client.WorkflowRun, error) {
	id := r.workflowID(t)
	in := TaskInput{Pipeline: r.p.Bundle(), TasksSource: tasksSource(t), Index: t.Index, Line: t.Line, Raw: t.Raw,
		Queue: r.opts.Queue, NodeTimeout: r.opts.NodeTimeout, LeaseTimeout: r.opts.LeaseTimeout,
		MaxFailovers: r.opts.MaxFailovers}
	wr, err := r.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: id, TaskQueue: r.opts.Queue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}, WorkflowName, in)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &started) { // finished earlier: its result stands
		return r.tc.GetWorkflow(ctx, id, ""), nil
	}
	return wr, err
}

// tasksSource is the name task errors are reported against (the tasks are already valid).
func tasksSource(pipeline.Task) string { return "tasks" }

// record counts a result and hands it to OnResult; false stops the run.
func (r *run) record(res pipeline.Result) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sum.Record(res, r.opts.OnResult, &r.sinkErr)
}
