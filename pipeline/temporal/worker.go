package temporal

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/deltabox/deltabox/internal/log"
	dbclient "github.com/deltabox/deltabox/orchestrator/client"
)

// WorkerConfig is a daemon's Temporal worker.
type WorkerConfig struct {
	Conn
	// Queues are the shared task queues this node takes tasks from (default: "deltabox").
	Queues []string
	// MaxTasks is how many tasks the node runs at once (its warm sandboxes): a node at it
	// stops taking new ones.
	MaxTasks int
	// Socket is the daemon's own API socket, which the activities use.
	Socket string
	// RetryEvery is the wait between attempts to reach Temporal (default 5 s).
	RetryEvery time.Duration
}

// RunWorker runs the node's workers until ctx ends. Temporal being unreachable is not
// fatal: it is logged and tried again, so a daemon starts without it.
func RunWorker(ctx context.Context, cfg WorkerConfig) {
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{DefaultQueue}
	}
	if cfg.RetryEvery <= 0 {
		cfg.RetryEvery = 5 * time.Second
	}
	ctx = log.With(ctx, "temporal", cfg.Address)
	for {
		err := runWorkers(ctx, cfg)
		if ctx.Err() != nil {
			return
		}
		log.L(ctx).Error("temporal worker stopped; retrying", "error", err, "in", cfg.RetryEvery)
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.RetryEvery):
		}
	}
}

// runWorkers connects, starts one worker per queue and waits for ctx to end.
func runWorkers(ctx context.Context, cfg WorkerConfig) error {
	api := dbclient.New(cfg.Socket)
	info, err := api.Info(ctx)
	if err != nil {
		return fmt.Errorf("daemon info: %w", err)
	}
	tc, err := Dial(ctx, cfg.Conn)
	if err != nil {
		return err
	}
	defer tc.Close()
	instance := fmt.Sprintf("%s-%d-%d", info.Node, os.Getpid(), time.Now().UnixNano())
	acts := &Activities{C: api, Node: info.Node, Instance: instance}
	releaseOrphans(ctx, api, instance)
	var started []worker.Worker
	defer func() {
		for _, w := range started {
			w.Stop()
		}
	}()
	for _, q := range cfg.Queues {
		w := newWorker(tc, q, cfg.MaxTasks, info.Node)
		w.RegisterWorkflowWithOptions(TaskWorkflow, workflow.RegisterOptions{Name: WorkflowName})
		acts.register(w)
		if err := w.Start(); err != nil {
			return fmt.Errorf("start worker on task queue %s: %w", q, err)
		}
		started = append(started, w)
	}
	log.L(ctx).Info("temporal worker started", "node", info.Node, "queues", cfg.Queues, "max_tasks", cfg.MaxTasks)
	<-ctx.Done()
	return nil
}

// newWorker is a worker of queue whose sessions (one per task) are bounded by maxTasks.
func newWorker(tc client.Client, queue string, maxTasks int, node string) worker.Worker {
	return worker.New(tc, queue, worker.Options{
		EnableSessionWorker:               true,
		MaxConcurrentSessionExecutionSize: max(maxTasks, 1),
		Identity:                          node + "@" + strconv.Itoa(os.Getpid()),
		WorkerStopTimeout:                 10 * time.Second,
	})
}

// releaseOrphans releases the sandboxes an earlier run of this node's worker leased: their
// sessions ended with it, so their tasks moved to other nodes.
func releaseOrphans(ctx context.Context, api *dbclient.Client, instance string) {
	sbs, err := api.Sandboxes(ctx)
	if err != nil {
		log.L(ctx).Warn("cannot list sandboxes for orphans", "error", err)
		return
	}
	for _, sb := range sbs {
		if sb.Labels[labelEngine] != "temporal" || sb.Labels[labelWorker] == instance {
			continue
		}
		if err := api.Release(ctx, sb.ID); err != nil {
			log.L(ctx).Warn("cannot release orphaned sandbox", "sandbox", sb.ID, "error", err)
			continue
		}
		log.L(ctx).Info("released sandbox of an earlier worker", "sandbox", sb.ID, "worker", sb.Labels[labelWorker])
	}
}
