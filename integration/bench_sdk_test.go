package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// BenchmarkPythonSDKOverhead times a state patch and an `exec true` through the Python SDK
// (sdk/python/tests/bench_overhead.py), the TypeScript SDK (sdk/typescript/test/bench_overhead.mjs)
// and the Go client, on the same sandbox in the same run, in alternating rounds; the
// *-py-over-go-ms and *-ts-over-go-ms metrics are what each SDK adds (p50).
func BenchmarkPythonSDKOverhead(b *testing.B) {
	python := testutil.RequiresBinary(b, "python3")
	script, err := filepath.Abs("../sdk/python/tests/bench_overhead.py")
	if err != nil {
		b.Fatal(err)
	}
	tsScript := filepath.Join(npmBuild(b, "sdk/typescript")[0], "test", "bench_overhead.mjs")
	d := startDaemon(b)
	d.createPool("bench", busyboxImage, 1)
	c, ctx := d.client(), context.Background()
	l, err := c.Lease(ctx, "bench", api.LeaseRequest{})
	if err != nil {
		b.Fatal(err)
	}
	var goPatch, goExec, pyPatch, pyExec, tsPatch, tsExec samples
	const rounds = 4
	per := max(b.N/rounds, 1)
	for r := 0; r < rounds; r++ {
		for i := 0; i < per; i++ {
			timed(&goPatch, func() {
				if _, err := c.StatePatch(ctx, l.ID, []byte(fmt.Sprintf(`[{"op":"add","path":"/n","value":%d}]`, i)), -1); err != nil {
					b.Fatal(err)
				}
			})
			timed(&goExec, func() {
				if st, err := c.Exec(ctx, l.ID, api.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err != nil || st.Code != 0 {
					b.Fatalf("exec true: %v %+v", err, st)
				}
			})
		}
		sdkRound(b, d.address, []string{python, script, l.ID, fmt.Sprint(per)}, &pyPatch, &pyExec)
		sdkRound(b, d.address, []string{"node", tsScript, l.ID, fmt.Sprint(per)}, &tsPatch, &tsExec)
	}
	goPatch.report(b, "patch-go")
	pyPatch.report(b, "patch-py")
	goExec.report(b, "exec-go")
	pyExec.report(b, "exec-py")
	b.ReportMetric(ms(pyPatch.pct(0.5)-goPatch.pct(0.5)), "patch-py-over-go-ms")
	b.ReportMetric(ms(pyExec.pct(0.5)-goExec.pct(0.5)), "exec-py-over-go-ms")
	tsPatch.report(b, "patch-ts")
	tsExec.report(b, "exec-ts")
	b.ReportMetric(ms(tsPatch.pct(0.5)-goPatch.pct(0.5)), "patch-ts-over-go-ms")
	b.ReportMetric(ms(tsExec.pct(0.5)-goExec.pct(0.5)), "exec-ts-over-go-ms")
}

// sdkRound runs one SDK's timing script (argv) against the daemon at address and adds the
// per-call times it printed to patch and exec.
func sdkRound(b *testing.B, address string, argv []string, patch, exe *samples) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(cmd.Environ(), "DELTABOX_ADDRESS="+address)
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%s: %v", argv[1], err)
	}
	var res struct {
		PatchUS []float64 `json:"patch_us"`
		ExecUS  []float64 `json:"exec_us"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("%s printed %q: %v", argv[1], out, err)
	}
	for i := range res.PatchUS {
		*patch = append(*patch, time.Duration(res.PatchUS[i]*1e3))
		*exe = append(*exe, time.Duration(res.ExecUS[i]*1e3))
	}
}
