package pipeline

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// Client is the part of the DeltaBox API a pipeline uses; *client.Client satisfies it.
type Client interface {
	Pool(ctx context.Context, name string) (api.PoolInfo, error)
	Lease(ctx context.Context, pool string, req api.LeaseRequest) (api.Lease, error)
	Exec(ctx context.Context, id string, req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error)
	Checkpoint(ctx context.Context, id string, req api.CheckpointRequest) (api.Checkpoint, error)
	Rollback(ctx context.Context, id string, req api.RollbackRequest) (api.RollbackResult, error)
	Commit(ctx context.Context, id string) (api.CommitResult, error)
	StatePatch(ctx context.Context, id string, ops []byte, ifSeq int64) (api.StatePatchResult, error)
	Effects(ctx context.Context, id, status string) ([]api.Effect, error)
	Release(ctx context.Context, id string) error
	CopyTo(ctx context.Context, id, dest string, tarStream io.Reader) (rootfs.ExtractResult, error)
}

// Options tune a run.
type Options struct {
	// Parallel is how many tasks run at once, each in its own sandbox (default 1).
	Parallel int
	// Done holds tasks finished by an earlier run (see ReadFinished); a task whose index and
	// ID match one is skipped.
	Done map[int]Result
	// OnResult receives every task's result as it ends, from one goroutine at a time. An
	// error stops the run.
	OnResult func(Result) error
	// LeaseTimeout bounds how long a task waits for a sandbox while the pool is at its max
	// (default 10 minutes).
	LeaseTimeout time.Duration
	// Output, when set, receives each attempt's stdout and stderr: Output(task, step,
	// attempt) returns a writer (closed after the attempt when it is an io.Closer).
	Output func(t Task, step string, attempt int) io.Writer
	// Labels are added to every lease's labels.
	Labels map[string]string
}

// runner is one run of a pipeline over a list of tasks.
type runner struct {
	c    Client
	p    *Pipeline
	opts Options

	mu      sync.Mutex
	sum     Summary
	sinkErr error
}

// Run runs every task of tasks through the pipeline, opts.Parallel at a time, and returns the
// summary. It checks that the pool exists before leasing anything. A cancelled ctx stops
// starting tasks; running ones are rolled back and released, and reported as interrupted.
func Run(ctx context.Context, c Client, p *Pipeline, tasks []Task, opts Options) (Summary, error) {
	start := time.Now()
	r := &runner{c: c, p: p, opts: opts, sum: Summary{Pipeline: p.DisplayName(), Tasks: len(tasks)}}
	if r.opts.Parallel < 1 {
		r.opts.Parallel = 1
	}
	if r.opts.LeaseTimeout <= 0 {
		r.opts.LeaseTimeout = 10 * time.Minute
	}
	if _, err := c.Pool(ctx, p.Pool); err != nil {
		return r.sum, fmt.Errorf("pipeline %s: pool %q: %w", p.DisplayName(), p.Pool, err)
	}
	todo := r.sum.SkipDone(tasks, r.opts.Done) // an earlier run finished the others
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.work(ctx, cancel, todo)
	r.sum.Interrupted += len(todo) - r.ended()
	r.sum.finish(start)
	return r.sum, r.sinkErr
}

func (r *runner) ended() int { return r.sum.Succeeded + r.sum.Failed + r.sum.Interrupted }

// work feeds the tasks to opts.Parallel workers until they are done or ctx ends.
func (r *runner) work(ctx context.Context, cancel func(), todo []Task) {
	ch := make(chan Task)
	var wg sync.WaitGroup
	for range min(r.opts.Parallel, max(len(todo), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range ch {
				if !r.record(runTask(ctx, r, t)) {
					cancel()
				}
			}
		}()
	}
	defer func() { close(ch); wg.Wait() }()
	for _, t := range todo {
		select {
		case ch <- t:
		case <-ctx.Done():
			return
		}
	}
}

// record counts a result and hands it to OnResult; false stops the run.
func (r *runner) record(res Result) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sum.Record(res, r.opts.OnResult, &r.sinkErr)
}

// logger returns ctx's logger with the pipeline and task attached.
func (r *runner) logger(ctx context.Context, t Task) context.Context {
	return log.With(ctx, "pipeline", r.p.DisplayName(), "task", t.Index)
}
