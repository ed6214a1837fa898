package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// BenchmarkE2BSDK times Sandbox.create() and commands.run('true') through the real e2b SDK
// against the E2B-compatible API, and the DeltaBox TypeScript SDK's lease and exec of `true`
// in the same Node process and run (integration/e2b/bench.mjs), from a warm pool. Targets
// (issue 17): create p50 <= 20 ms, run p50 <= 10 ms; the *-over-sdk-ms metrics are what the
// E2B path adds over DeltaBox's own SDK (p50).
func BenchmarkE2BSDK(b *testing.B) {
	node := testutil.RequiresBinary(b, "node")
	nodePath := testutil.RequiresEnv(b, "DELTABOX_E2B_NODE_PATH")
	script, err := filepath.Abs("e2b/bench.mjs")
	if err != nil {
		b.Fatal(err)
	}
	tsSDK, err := filepath.Abs("../sdk/typescript/dist/index.js")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(tsSDK); err != nil {
		testutil.SkipOrFail(b, "the TypeScript SDK is not built (make setup runs hack/npm.sh): %v", err)
	}
	g := startE2BDaemon(b, "bench", 8)
	const rounds = 4
	per := max(b.N/rounds, 1)
	cmd := exec.Command(node, script, fmt.Sprint(per), fmt.Sprint(rounds))
	cmd.Env = append(os.Environ(), append(g.env(), "DELTABOX_E2B_NODE_PATH="+nodePath, "DELTABOX_TS_SDK="+tsSDK,
		"DELTABOX_ADDRESS="+g.address, "DELTABOX_E2B_TEMPLATE=bench")...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%s: %v\n%s", script, err, g.logTail())
	}
	var res map[string][]float64
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("%s printed %q: %v", script, out, err)
	}
	s := map[string]samples{}
	for k, us := range res {
		for _, v := range us {
			s[k] = append(s[k], time.Duration(v*1e3))
		}
	}
	create, lease, run, execS := s["e2b_create_us"], s["sdk_lease_us"], s["e2b_run_us"], s["sdk_exec_us"]
	create.report(b, "e2b-create")
	lease.report(b, "sdk-lease")
	run.report(b, "e2b-run")
	execS.report(b, "sdk-exec")
	b.ReportMetric(ms(create.pct(0.5)-lease.pct(0.5)), "create-over-sdk-ms")
	b.ReportMetric(ms(run.pct(0.5)-execS.pct(0.5)), "run-over-sdk-ms")
}
