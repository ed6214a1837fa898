package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// target is a figure a benchmark metric is held to: at most (or, when atLeast, at least) limit.
type target struct {
	what, bench, metric string
	limit               float64
	atLeast             bool
}

var targets = []target{
	{"pool back to 10 ready within 3 s after 10 leases", "Refill", "refill10-p99-ms", 3000, false},
	{"lease p50 <= 5 ms", "LeaseVsCtrRun", "lease-api-p50-ms", 5, false},
	{"lease >= 20x faster than cold ctr run --rm", "LeaseVsCtrRun", "ctr-run/lease-x", 20, true},
	{"exec true p50 <= 5 ms", "ExecVsCtrExec", "exec-api-p50-ms", 5, false},
	{"exec >= 5x faster than ctr task exec", "ExecVsCtrExec", "ctr-exec/exec-x", 5, true},
	{"deltabox lease (CLI) p50 <= 10 ms", "LeaseVsCtrRun", "lease-cli-p50-ms", 10, false},
	{"deltabox exec ID true (CLI) p50 <= 10 ms", "ExecVsCtrExec", "exec-cli-p50-ms", 10, false},
	{"L1 checkpoint p50 <= 5 ms", "CheckpointRollback", "ckpt-l1-p50-ms", 5, false},
	{"L1 checkpoint p99 <= 20 ms", "CheckpointRollback", "ckpt-l1-p99-ms", 20, false},
	{"rollback p50 <= 10 ms", "CheckpointRollback", "rollback-p50-ms", 10, false},
	{"rollback >= 20x faster than ctr checkpoint + restore", "CheckpointRollback", "ctr/rollback-x", 20, true},
	{"files-only rollback (10 changed files in a 5,000-file upper) p50 <= 1.5 ms", "CheckpointRollback", "rollback-p50-ms", 1.5, false},
	{"L3 frozen p50 <= 300 ms", "L3SnapshotRestore", "l3-frozen-p50-ms", 300, false},
	{"L3 restore from the local store (50 MB of heap) p50 <= 250 ms", "L3SnapshotRestore", "l3-restore-p50-ms", 250, false},
	{"L3 restore from the local store (50 MB of heap), no user namespace, p50 <= 250 ms", "L3SnapshotRestore", "l3-restore-no-userns-p50-ms", 250, false},
	{"lease in a user namespace within 10% of one without (same run)", "UserNamespaceCost", "lease-userns/no-userns", 1.1, false},
	{"exec in a user namespace within 10% of one without (same run)", "UserNamespaceCost", "exec-userns/no-userns", 1.1, false},
	{"L1 checkpoint in a user namespace within 10% of one without (same run)", "UserNamespaceCost", "ckpt-l1-userns/no-userns", 1.1, false},
	{"rollback in a user namespace within 10% of one without (same run)", "UserNamespaceCost", "rollback-userns/no-userns", 1.1, false},
	{"checkpoint with processes p50 <= 10 ms", "ProcessRollback", "ckpt-procs-p50-ms", 10, false},
	{"checkpoint with processes: frozen p50 <= 2 ms", "ProcessRollback", "ckpt-procs-frozen-p50-ms", 2, false},
	{"rollback with processes p50 <= 2 ms", "ProcessRollback", "rollback-procs-p50-ms", 2, false},
	{"rollback with processes p99 <= 5 ms", "ProcessRollback", "rollback-procs-p99-ms", 5, false},
	{"rollback with processes >= 100x faster than L3 rollback", "ProcessRollback", "l3/rollback-procs-x", 100, true},
	{"fork --from CKPT p50 <= 50 ms per fork (5,000-file upper, 100 changed, N=8)", "ForkFromCheckpoint", "fork-from-p50-ms", 50, false},
	{"fork --from CKPT faster than the L3 fork", "ForkFromCheckpoint", "l3/fork-from-x", 1, true},
	{"state patch through the Python SDK <= 1 ms over the Go client", "PythonSDKOverhead", "patch-py-over-go-ms", 1, false},
	{"exec true through the Python SDK <= 1 ms over the Go client", "PythonSDKOverhead", "exec-py-over-go-ms", 1, false},
	{"state patch through the TypeScript SDK <= 1 ms over the Go client", "PythonSDKOverhead", "patch-ts-over-go-ms", 1, false},
	{"exec true through the TypeScript SDK <= 1 ms over the Go client", "PythonSDKOverhead", "exec-ts-over-go-ms", 1, false},
	{"e2b SDK Sandbox.create() p50 <= 20 ms (warm pool)", "E2BSDK", "e2b-create-p50-ms", 20, false},
	{"e2b SDK commands.run('true') p50 <= 10 ms", "E2BSDK", "e2b-run-p50-ms", 10, false},
}

// verdict says whether results meet t: "met", "MISSED" or "not measured".
func (t target) verdict(results []result) (value, verdict string) {
	for _, r := range results {
		if benchName(r.name) != t.bench {
			continue
		}
		v, ok := r.metrics[t.metric]
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return v, "not measured"
		}
		if (t.atLeast && f >= t.limit) || (!t.atLeast && f <= t.limit) {
			return v, "met"
		}
		return v, "MISSED"
	}
	return "", "not measured"
}

// benchName drops the -GOMAXPROCS suffix go test adds ("Refill-2" -> "Refill").
func benchName(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 && isCount(name[i+1:]) {
		return name[:i]
	}
	return name
}

func writeTargets(w io.Writer, results []result) {
	fmt.Fprintln(w, "\n## Targets\n\n| target | benchmark | metric | limit | value | |\n|---|---|---|---|---|---|")
	for _, t := range targets {
		op := "<="
		if t.atLeast {
			op = ">="
		}
		value, verdict := t.verdict(results)
		fmt.Fprintf(w, "| %s | %s | %s | %s %g | %s | %s |\n", t.what, t.bench, t.metric, op, t.limit, value, verdict)
	}
}
