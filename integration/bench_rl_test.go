package integration

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// BenchmarkRLLoop is the reinforcement-learning loop of issue 14: lease, then b.N iterations
// of (reset to the start checkpoint, one step that writes a file and mutates a Python REPL's
// 50 MB heap). A reset is a rollback to a checkpoint taken with processes; the baselines in
// the same run reset with an L3 rollback and with release + lease + starting the REPL again
// (a fresh sandbox has none of its memory), a few rounds each. Reported: each reset's p50
// and the resets per second one sandbox gets from it (reset time only: the step, which goes
// through exec, is the same for all three), and an API exec of `true` right after each
// template reset (exec-after-reset: what the loop's next call waits for).
func BenchmarkRLLoop(b *testing.B) {
	d := startDaemon(b)
	d.createPool("py", pythonImage, 2, "--max", "8")
	d.createPool("py3", pythonImage, 1)
	c, ctx := d.client(), context.Background()
	startIn := func(pool string) (string, pipeShell) {
		id := d.lease(pool).ID
		d.cli("exec", id, "--", "sh", "-c", "cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
		py := startPiped(d, id, "py", "python3 /repl.py")
		py.ask("import os; heap = bytearray(os.urandom(50 << 20)); n = 0")
		return id, py
	}
	start := func() (string, pipeShell) { return startIn("py") }
	id, py := start()
	step := func(id string, py pipeShell, i int) {
		d.cli("exec", id, "--", "sh", "-c", fmt.Sprintf("echo %d > /step.txt", i))
		py.ask(fmt.Sprintf("heap[%d] = 1; n += 1", (i*4096)%(50<<20)))
	}
	yes := true
	ck, err := c.Checkpoint(ctx, id, api.CheckpointRequest{Processes: &yes})
	if err != nil {
		b.Fatal(err)
	}
	var tpl, execAfter samples
	for i := 0; i < b.N; i++ {
		timed(&tpl, func() {
			if _, err := c.Rollback(ctx, id, api.RollbackRequest{To: ck.ID}); err != nil {
				b.Fatal(err)
			}
		})
		timed(&execAfter, func() { // the loop's next call: it must not wait for the reset's background work
			if st, err := c.Exec(ctx, id, api.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err != nil || st.Code != 0 {
				b.Fatalf("exec after reset %d: %+v %v", i, st, err)
			}
		})
		if got := py.ask("n"); got != "0" {
			b.Fatalf("after reset %d: n = %s, want 0", i, got)
		}
		step(id, py, i)
	}
	rounds := max(3, min(10, b.N/50))

	// Baseline 1: L3 rollbacks (a second sandbox: CRIU cannot dump one with templates).
	id2, py2 := startIn("py3")
	ck3, err := c.Checkpoint(ctx, id2, api.CheckpointRequest{Level: api.LevelL3})
	if err != nil {
		b.Fatal(err)
	}
	var l3 samples
	for i := 0; i < rounds; i++ {
		step(id2, py2, i)
		timed(&l3, func() {
			if _, err := c.Rollback(ctx, id2, api.RollbackRequest{To: ck3.ID}); err != nil {
				b.Fatal(err)
			}
		})
	}
	if got := py2.ask("n"); got != "0" {
		b.Fatalf("after L3 resets: n = %s, want 0", got)
	}
	_ = c.Release(ctx, id2)

	// Baseline 2: release, lease and start the REPL (with its heap) again.
	var fresh samples
	cur := id
	for i := 0; i < rounds; i++ {
		timed(&fresh, func() {
			if err := c.Release(ctx, cur); err != nil {
				b.Fatal(err)
			}
			cur, _ = start()
		})
	}
	tpl.report(b, "reset-template")
	execAfter.report(b, "exec-after-reset")
	l3.report(b, "reset-l3")
	fresh.report(b, "reset-release+lease")
	perSec := func(s samples) float64 { return float64(time.Second) / float64(s.pct(0.5)) }
	b.ReportMetric(perSec(tpl), "resets/s-template")
	b.ReportMetric(perSec(l3), "resets/s-l3")
	b.ReportMetric(perSec(fresh), "resets/s-release+lease")
}
