package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// BenchmarkProcessRollback measures checkpoints with processes and rollbacks to them of a
// sandbox running a Python REPL with 50 MB of heap and a bash session (both driven through
// pipes) over a 5,000-file tree: each step changes 10 files, the heap and the shell's
// variables. The baseline, in the same run and the same sandbox, is an L3 checkpoint and
// in-place rollback (CRIU), taken first: CRIU cannot dump a sandbox while templates live.
// It also reports what the templates of 10 checkpoints cost against the REPL's RSS.
//
// DELTABOX_BENCH_TEMPLATE_CHECKPOINTS sets [checkpoints] template_checkpoints (0: every
// retained checkpoint keeps its templates), to compare the fork's cost with the lineage.
func BenchmarkProcessRollback(b *testing.B) {
	config := ""
	if v := os.Getenv("DELTABOX_BENCH_TEMPLATE_CHECKPOINTS"); v != "" {
		config = "[checkpoints]\ntemplate_checkpoints = " + v + "\n"
	}
	d := startDaemonWith(b, config)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	c, ctx := d.client(), context.Background()
	d.cli("exec", id, "--timeout", "5m", "--", "python3", "-c",
		`import os
for d in range(50):
    os.makedirs("/t/%d" % d, exist_ok=True)
    for f in range(100):
        open("/t/%d/%d" % (d, f), "w").write("%d %d\n" % (d, f))`)
	d.cli("exec", id, "--", "sh", "-c", "cat > /repl.py <<'EOF_REPL'\n"+replPy+"\nEOF_REPL")
	py := startPiped(d, id, "py", "python3 /repl.py")
	sh := startPiped(d, id, "sh", "bash")
	py.ask("import os; heap = bytearray(os.urandom(50 << 20)); n = 0")
	sh.ask("V=0; echo ok")
	step := func(i int) {
		d.cli("exec", id, "--", "sh", "-c", `for i in $(seq 0 9); do head -c 4096 /dev/urandom > /t/$i/step; done`)
		py.ask(fmt.Sprintf("heap[%d] = %d; n = %d", (i*4096*97)%(50<<20), i%256, i))
		sh.ask(fmt.Sprintf("V=%d; echo ok", i))
	}
	check := func(want int) {
		if got := py.ask("n"); got != strconv.Itoa(want) {
			b.Fatalf("REPL n = %s after rollback, want %d", got, want)
		}
	}

	// Baseline: L3 (CRIU) checkpoint and in-place rollback of the same sandbox.
	// DELTABOX_BENCH_NO_L3=1 leaves it out (focused runs of the templates alone).
	var l3 samples
	l3Rounds := max(3, b.N/20)
	if os.Getenv("DELTABOX_BENCH_NO_L3") == "1" {
		l3Rounds = 0
	}
	for i := 0; i < l3Rounds; i++ {
		ck, err := c.Checkpoint(ctx, id, api.CheckpointRequest{Level: api.LevelL3})
		if err != nil {
			b.Fatal(err)
		}
		step(1000 + i)
		timed(&l3, func() {
			if _, err := c.Rollback(ctx, id, api.RollbackRequest{To: ck.ID}); err != nil {
				b.Fatal(err)
			}
		})
	}
	check(0)

	// One checkpoint with processes first, not measured: the first one captures the setup's
	// 5,000 files (without the L3 rounds) and collapses the REPL's heap into huge pages
	// before its freeze (~0.1 s, once per process), which short runs would report as p99.
	yes := true
	if _, err := c.Checkpoint(ctx, id, api.CheckpointRequest{Processes: &yes}); err != nil {
		b.Fatal(err)
	}
	var ckpt, frozen, rb, rbFrozen samples
	var tplBytes int64
	for i := 0; i < b.N; i++ {
		step(i)
		start := time.Now()
		ck, err := c.Checkpoint(ctx, id, api.CheckpointRequest{Processes: &yes})
		if err != nil {
			b.Fatal(err)
		}
		ckpt = append(ckpt, time.Since(start))
		frozen = append(frozen, msDur(ck.FrozenMS))
		step(i + 1)
		start = time.Now()
		res, err := c.Rollback(ctx, id, api.RollbackRequest{To: ck.ID})
		if err != nil {
			b.Fatal(err)
		}
		rb = append(rb, time.Since(start))
		rbFrozen = append(rbFrozen, msDur(res.FrozenMS))
		if res.ProcessesRestored != 2 || len(res.ProcessesLost) != 0 {
			b.Fatalf("rollback %d: %+v", i, res)
		}
		if i == 9 { // the templates of the last 10 checkpoints, against the REPL's RSS
			cks, err := c.Checkpoints(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			for _, k := range cks[len(cks)-10:] {
				tplBytes += k.TemplateBytes
			}
		}
	}
	check(b.N - 1)
	rss := d.cli("exec", id, "--", "sh", "-c", `for p in /proc/[0-9]*; do [ "$(cat $p/comm)" = python3 ] && [ "$(sed 's/.*) //' $p/stat | cut -c1)" != t ] && awk '/VmRSS/ {print $2}' $p/status; done | head -1`)
	rssKB, _ := strconv.Atoi(strings.TrimSpace(rss))
	ckpt.report(b, "ckpt-procs")
	frozen.report(b, "ckpt-procs-frozen")
	rb.report(b, "rollback-procs")
	rbFrozen.report(b, "rollback-procs-frozen")
	if len(l3) > 0 {
		l3.report(b, "rollback-l3")
		b.ReportMetric(float64(l3.pct(0.5))/float64(rb.pct(0.5)), "l3/rollback-procs-x")
	}
	if b.N >= 10 {
		b.ReportMetric(float64(tplBytes)/(1<<20), "templates10-MiB")
		b.ReportMetric(float64(rssKB)/1024, "repl-rss-MiB")
	}
}
