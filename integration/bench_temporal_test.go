package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pipeline"
)

// BenchmarkTemporalPipeline measures what running a pipeline through Temporal costs and
// gains (docs/scale-out.md): 24 tasks x 5 steps of `sleep 1`, with the same capacity per
// node (4 sandboxes), run (1) locally on node 1 with --parallel 4, (2) through Temporal on
// node 1 alone (its own task queue), (3) through Temporal on three nodes. It reports the
// dispatch overhead per step (2 against 1, as one of the 4 workers sees it), the throughput
// of three nodes against one, and Temporal's own round trip for one no-op activity on the
// same server (the floor of the dispatch overhead). The steps wait (as an agent waits for
// its model) rather than compute, so that the nodes' capacity, not this machine's shared
// cores, bounds the throughput.
func BenchmarkTemporalPipeline(b *testing.B) {
	e1 := requireEnv(b)
	e2 := env{bin: e1.bin, containerd: testutil.RequiresEnv(b, "DELTABOX_CONTAINERD2_ADDRESS")}
	e3 := env{bin: e1.bin, containerd: testutil.RequiresEnv(b, "DELTABOX_CONTAINERD3_ADDRESS")}
	addr := startTemporalDev(b)
	const tasks, steps, perNode = 24, 5, 4
	var nodes []*daemon
	for i, e := range []env{e1, e2, e3} {
		queues := `["fleet"]`
		if i == 0 {
			queues = `["one", "fleet"]`
		}
		d := startDaemonOn(b, e, fmt.Sprintf("[temporal]\naddress = %q\ntask_queues = %s\nmax_tasks = %d\n", addr, queues, perNode))
		d.createPool("bb", busyboxImage, perNode, "--max", fmt.Sprint(perNode))
		nodes = append(nodes, d)
	}
	dir := shortTempDir(b)
	pfile, tfile := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "tasks.jsonl")
	var p strings.Builder
	p.WriteString("name: tbench\npool: bb\nsteps:\n")
	for i := range steps {
		fmt.Fprintf(&p, "  - name: s%d\n    run: [sleep, \"1\"]\n", i+1)
	}
	os.WriteFile(pfile, []byte(p.String()), 0o644)
	var t strings.Builder
	for i := range tasks {
		fmt.Fprintf(&t, "{\"id\": \"t%d\"}\n", i)
	}
	os.WriteFile(tfile, []byte(t.String()), 0o644)
	run := func(args ...string) time.Duration {
		start := time.Now()
		out := nodes[0].cli(append([]string{"-o", "json", "run", pfile, "--tasks", tfile}, args...)...)
		took := time.Since(start)
		var last struct{ Summary pipeline.Summary }
		lastJSON(b, out, &last)
		if last.Summary.Succeeded != tasks {
			b.Fatalf("run %v: %+v", args, last.Summary)
		}
		return took
	}
	var local, one, three time.Duration
	for i := range b.N {
		local += run("--parallel", fmt.Sprint(perNode))
		key := fmt.Sprintf("--run-key=%d-%d", time.Now().UnixNano(), i)
		one += run("--engine", "temporal://"+addr+"?task_queue=one", key)
		three += run("--engine", "temporal://"+addr+"?task_queue=fleet", key)
	}
	n := float64(b.N)
	b.ReportMetric(local.Seconds()/n, "local-s")
	b.ReportMetric(one.Seconds()/n, "temporal-1node-s")
	b.ReportMetric(three.Seconds()/n, "temporal-3nodes-s")
	b.ReportMetric(float64(one-local)/n/float64(tasks*steps)/float64(time.Millisecond)*perNode, "dispatch-overhead-per-step-ms")
	b.ReportMetric(float64(one)/float64(three), "throughput-3v1-x")
	b.ReportMetric(temporalRoundTrip(b, addr), "temporal-roundtrip-ms")
}

// noopWorkflow runs n no-op activities one after another.
func noopWorkflow(ctx workflow.Context, n int) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	for range n {
		if err := workflow.ExecuteActivity(ctx, "noop").Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

// temporalRoundTrip is the baseline of the dispatch overhead: one no-op activity scheduled
// by a workflow and run by an in-process worker on the same dev server, in milliseconds.
func temporalRoundTrip(b *testing.B, addr string) float64 {
	tc, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		b.Fatal(err)
	}
	defer tc.Close()
	w := worker.New(tc, "noop", worker.Options{})
	w.RegisterWorkflow(noopWorkflow)
	w.RegisterActivityWithOptions(func(context.Context) error { return nil }, activity.RegisterOptions{Name: "noop"})
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	const n = 50
	start := time.Now()
	run, err := tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: "noop"}, noopWorkflow, n)
	if err == nil {
		err = run.Get(context.Background(), nil)
	}
	if err != nil {
		b.Fatal(err)
	}
	return float64(time.Since(start).Microseconds()) / 1000 / n
}
