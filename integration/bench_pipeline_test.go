package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pipeline"
)

// benchStep is one step's command: it records itself, step 3 POSTs to the upstream (held until
// the task commits), and about 20% of steps fail once (on their first attempt, after their
// work, so the rollback has something to undo).
func benchStep(i int, apiURL string) string {
	post := ""
	if i == 3 {
		post = fmt.Sprintf(`curl -sS -m 20 -o /dev/null -d "task=$DELTABOX_TASK_ID" %s/items || exit 2; `, apiURL)
	}
	return fmt.Sprintf(`echo %d >> /tmp/steps; %s[ "$DELTABOX_ATTEMPT" != 1 ] || [ $(( (DELTABOX_SEED + %d) %% 5 )) != 0 ] || exit 1`, i, post, i*3)
}

func benchPipeline(pool, apiURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: bench\npool: %s\nseed: 7\ncommit: task\ntimeout: 60s\nenv: {NO_PROXY: \"\", no_proxy: \"\"}\nsteps:\n", pool)
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&b, "  - name: s%d\n    script: '%s'\n    retry: {attempts: 2, backoff: 10ms}\n", i, strings.ReplaceAll(benchStep(i, apiURL), "'", "''"))
	}
	return b.String()
}

// BenchmarkPipeline runs DELTABOX_BENCH_TASKS (default 200) tasks of 5 steps, about 20% of
// steps failing once, 16 in parallel, through `deltabox run`; it checks that every task
// finished and that the upstream received each task's POST exactly once, and compares with
// running the same commands without checkpoints (plain exec in leased sandboxes).
func BenchmarkPipeline(b *testing.B) {
	tasks := 200
	if v, err := strconv.Atoi(os.Getenv("DELTABOX_BENCH_TASKS")); err == nil {
		tasks = v
	}
	runBenchPipeline(b, tasks, b.N)
}

// TestPipelineEffectsReachUpstreamOnce is the CI-sized pipeline target: 20 tasks x 5 steps,
// about 20% of steps failing once, 16 in parallel; every task finishes and the upstream gets
// each task's POST exactly once (rolled-back attempts' POSTs are dropped).
func TestPipelineEffectsReachUpstreamOnce(t *testing.T) {
	runBenchPipeline(t, 20, 1)
}

// runBenchPipeline runs the pipeline n times and checks (and, for a benchmark, reports) it.
func runBenchPipeline(b testing.TB, tasks, n int) {
	u := startUpstream(b)
	d := startDaemonWith(b, fmt.Sprintf("[egress]\nupstream_ca_file = %q\n", u.ca))
	policy := filepath.Join(shortTempDir(b), "policy.yaml")
	os.WriteFile(policy, []byte(egressPolicy), 0o644)
	d.createPool("bench", pythonImage, 16, "--egress-policy", policy, "--max", "48")
	dir := shortTempDir(b)
	pipe, tasksFile := filepath.Join(dir, "bench.yaml"), filepath.Join(dir, "tasks.jsonl")
	os.WriteFile(pipe, []byte(benchPipeline("bench", u.plain.URL)), 0o644)
	var lines strings.Builder
	for i := 0; i < tasks; i++ {
		fmt.Fprintf(&lines, "{\"id\": \"t%d\"}\n", i)
	}
	os.WriteFile(tasksFile, []byte(lines.String()), 0o644)
	var sum pipeline.Summary
	var withCkpt, without time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		out := d.cli("-o", "json", "run", pipe, "--tasks", tasksFile, "--parallel", "16")
		withCkpt = time.Since(start)
		var last struct{ Summary pipeline.Summary }
		lastJSON(b, out, &last)
		sum = last.Summary
		if _, isBench := b.(*testing.B); isBench {
			without = plainRun(b, d, tasks, u.plain.URL)
		}
	}
	if sum.Succeeded != tasks || sum.Failures == 0 {
		b.Fatalf("pipeline summary: %+v", sum)
	}
	if got := u.count("POST /items"); got != tasks*n {
		b.Fatalf("upstream received %d POSTs from %d tasks; want exactly one each (none lost, none sent twice)", got, tasks*n)
	}
	if sum.Effects.Committed != tasks || sum.Effects.Held != 0 {
		b.Fatalf("effects: %+v, want %d committed and none held", sum.Effects, tasks)
	}
	bb, ok := b.(*testing.B)
	if !ok {
		return
	}
	reportPipeline(bb, sum, tasks, withCkpt, without)
}

func reportPipeline(b *testing.B, sum pipeline.Summary, tasks int, withCkpt, without time.Duration) {
	steps := float64(tasks * 5)
	b.ReportMetric(float64(sum.Failures)/steps*100, "failed-steps-%")
	b.ReportMetric(float64(sum.Rollbacks), "rollbacks")
	b.ReportMetric(float64(sum.Effects.Committed), "effects-committed")
	b.ReportMetric(float64(sum.Effects.Dropped), "effects-dropped")
	b.ReportMetric(sum.CheckpointMS.P50, "ckpt-p50-ms")
	b.ReportMetric(sum.CheckpointMS.P99, "ckpt-p99-ms")
	b.ReportMetric(sum.RollbackMS.P50, "rollback-p50-ms")
	b.ReportMetric(sum.RollbackMS.P99, "rollback-p99-ms")
	b.ReportMetric(withCkpt.Seconds(), "run-s")
	b.ReportMetric(without.Seconds(), "no-checkpoints-s")
	b.ReportMetric(withCkpt.Seconds()/without.Seconds(), "slowdown-x")
	// Wall-clock overhead per step as one of the 16 workers sees it (retries of failed steps
	// included: the baseline runs every step once).
	b.ReportMetric(float64(withCkpt-without)/steps/float64(time.Millisecond)*16, "overhead-per-step-ms")
}

// plainRun runs the same five commands per task with 16 leased sandboxes and no checkpoints,
// failures or retries: the baseline for the pipeline's overhead.
func plainRun(b testing.TB, d *daemon, tasks int, apiURL string) time.Duration {
	c, ctx := d.client(), context.Background()
	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				l, err := c.Lease(ctx, "bench", api.LeaseRequest{Env: []string{"NO_PROXY=", "no_proxy="}})
				if err != nil {
					b.Error(err)
					return
				}
				env := []string{"DELTABOX_ATTEMPT=2", "DELTABOX_SEED=0", fmt.Sprintf("DELTABOX_TASK_ID=plain%d", t)}
				for i := 1; i <= 5; i++ {
					cmd := strings.ReplaceAll(benchStep(i, apiURL), "/items", "/plain")
					c.Exec(ctx, l.ID, api.ExecRequest{Argv: []string{"sh", "-c", cmd}, Env: env}, nil, io.Discard, io.Discard)
				}
				c.Commit(ctx, l.ID)
				c.Release(ctx, l.ID)
			}
		}()
	}
	for t := 0; t < tasks; t++ {
		work <- t
	}
	close(work)
	wg.Wait()
	return time.Since(start)
}
