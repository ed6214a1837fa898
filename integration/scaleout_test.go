package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/deltabox/deltabox/internal/testutil"
)

// startTemporalDev runs `temporal server start-dev` (DELTABOX_TEMPORAL, installed by
// hack/install-temporal.sh) on free loopback ports and returns its frontend address.
func startTemporalDev(t testing.TB) string {
	t.Helper()
	bin := testutil.RequiresEnv(t, "DELTABOX_TEMPORAL")
	if _, err := os.Stat(bin); err != nil {
		testutil.SkipOrFail(t, "temporal CLI %s: %v (make deps installs it)", bin, err)
	}
	port := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	}
	fe := port()
	logs := &testutil.SyncBuffer{}
	cmd := exec.Command(bin, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", fe,
		"--http-port", port(), "--metrics-port", port(), "--db-filename", filepath.Join(shortTempDir(t), "temporal.db"),
		"--log-level", "error")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start temporal dev server: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + fe
	testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "temporal dev server on "+addr, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// fleetResult is the part of a result line the scale-out test checks.
type fleetResult struct {
	Index     int      `json:"index"`
	ID        string   `json:"id"`
	Status    string   `json:"status"`
	Node      string   `json:"node"`
	Nodes     []string `json:"nodes"`
	Failovers int      `json:"failovers"`
	Commits   int      `json:"commits"`
	Error     string   `json:"error"`
}

// readResults reads a results file's finished task lines.
func readResults(t *testing.T, path string) []fleetResult {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []fleetResult
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r fleetResult
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.ID != "" && (r.Status == "succeeded" || r.Status == "failed") {
			out = append(out, r)
		}
	}
	return out
}

// fleetPipeline POSTs one effect per task (held by the proxy, committed at the end of the
// task) in its first step, a failover point, then works for a while. Busybox wget turns a
// POST into a GET behind a proxy, so the POST is written to the proxy by hand with nc.
const fleetPipeline = `name: fleet
pool: bb
steps:
  - name: effect
    script: |
      mkdir -p /work
      p=${http_proxy#http://}; p=${p%%/*}
      printf 'POST UPSTREAM/effects/%s HTTP/1.1\r\nHost: HOSTPORT\r\nContent-Length: 4\r\nConnection: close\r\n\r\ntask' "$TASK_ID" |
        nc ${p%:*} ${p##*:} > /work/effect.out
      grep -q ' 202 ' /work/effect.out || { cat /work/effect.out; exit 1; }
      echo "$DELTABOX_SEED" > /work/seed
    failover: l3
  - name: work
    script: |
      sleep 3
      test -s /work/effect.out && echo done > /work/work.out
  - name: verify
    script: test -s /work/work.out && test -s /work/seed
`

// TestScaleOutTemporal: three nodes (each its own containerd) take a 30-task pipeline from
// one Temporal dev server and share one S3 store; mid-run the `deltabox run` client is
// killed and started again (it picks up the running workflows), one node is killed with
// SIGKILL (its tasks continue elsewhere from their L3 failover point) and another node's
// daemon is restarted (its worker loses no task). Every task ends exactly once, and the
// upstream sees each task's effect under exactly one Idempotency-Key.
func TestScaleOutTemporal(t *testing.T) {
	e1 := requireEnv(t)
	e2 := env{bin: e1.bin, containerd: testutil.RequiresEnv(t, "DELTABOX_CONTAINERD2_ADDRESS")}
	e3 := env{bin: e1.bin, containerd: testutil.RequiresEnv(t, "DELTABOX_CONTAINERD3_ADDRESS")}
	addr := startTemporalDev(t)
	s3 := startS3(t)
	u := startUpstream(t)
	dir := shortTempDir(t)
	cfg := fmt.Sprintf("[object_store]\nuri = %q\n[snapshots]\nsigning_key = %q\n[temporal]\naddress = %q\nmax_tasks = 3\n",
		s3.URI("fleet"), filepath.Join(dir, "fleet.key"), addr) // one signing key: the fleet trusts itself
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte(egressPolicy), 0o644)
	var nodes []*daemon
	ids := map[string]int{}
	for i, e := range []env{e1, e2, e3} {
		d := startDaemonOn(t, e, cfg)
		d.createPool("bb", busyboxImage, 3, "--egress-policy", policy, "--max", "6")
		var info struct{ Node string }
		d.cliJSON(&info, "info")
		ids[info.Node] = i
		nodes = append(nodes, d)
	}
	if len(ids) != 3 {
		t.Fatalf("node IDs %v: want 3 distinct", ids)
	}
	pfile, tfile, results := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "tasks.jsonl"), filepath.Join(dir, "results.jsonl")
	yaml := strings.NewReplacer("UPSTREAM", u.plain.URL, "HOSTPORT", strings.TrimPrefix(u.plain.URL, "http://")).Replace(fleetPipeline)
	os.WriteFile(pfile, []byte(yaml), 0o644)
	const n = 30
	var tasks strings.Builder
	for i := range n {
		fmt.Fprintf(&tasks, "{\"id\": \"t%02d\"}\n", i)
	}
	os.WriteFile(tfile, []byte(tasks.String()), 0o644)
	args := []string{"-o", "json", "run", pfile, "--tasks", tfile, "--results", results,
		"--engine", "temporal://" + addr, "--node-timeout", "3s"}
	start := time.Now()

	// Run 1, killed once a few tasks ended: the workflows go on without it.
	run1 := exec.Command(e1.bin, args...)
	if err := run1.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 90*time.Second, 100*time.Millisecond, "3 tasks to end", func() bool { return len(readResults(t, results)) >= 3 })
	_ = run1.Process.Signal(syscall.SIGKILL)
	_ = run1.Wait()

	// Node 3 dies (kill -9) while it holds tasks.
	victim := nodes[2]
	testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "node 3 to hold a task", func() bool { return heldTasks(victim, 2*time.Second) > 0 })
	victim.kill()
	t.Logf("killed node 3 after %s", time.Since(start))

	// Run 2 picks up the running workflows; node 2's daemon restarts in the middle.
	var out2, err2 strings.Builder
	run2 := exec.Command(e1.bin, args...)
	run2.Stdout, run2.Stderr = &out2, &err2
	if err := run2.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run2.Wait() }()
	testutil.WaitFor(t, 120*time.Second, 100*time.Millisecond, "15 tasks to end", func() bool { return len(readResults(t, results)) >= 15 })
	nodes[1].stop()
	nodes[1].start()
	t.Logf("restarted node 2 after %s", time.Since(start))
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run 2: %v\nstderr: %s", err, err2.String())
		}
	case <-time.After(3 * time.Minute):
		_ = run2.Process.Kill()
		t.Fatalf("run 2 did not end within 3 min; stderr: %s", err2.String())
	}
	t.Logf("all tasks ended after %s", time.Since(start))
	checkFleetResults(t, readResults(t, results), ids, n)
	checkFleetEffects(t, u, n)
}

// heldTasks counts the sandboxes a node leased for Temporal tasks within the last young: a
// task's steps take longer than that (its work step sleeps 3 s), so their tasks have not
// ended (a sandbox outlives its task's last step for a moment: a kill then fails nothing
// over).
func heldTasks(d *daemon, young time.Duration) int {
	sbs, err := d.client().Sandboxes(d.t.Context())
	if err != nil {
		return 0
	}
	k := 0
	for _, s := range sbs {
		if s.Labels["deltabox.engine"] == "temporal" && time.Since(s.LeasedAt) < young {
			k++
		}
	}
	return k
}

// checkFleetResults: every task ended exactly once and succeeded, every node ran some, and
// some tasks failed over.
func checkFleetResults(t *testing.T, res []fleetResult, ids map[string]int, n int) {
	t.Helper()
	seen := map[string]int{}
	ran := map[string]int{}
	failedOver := 0
	for _, r := range res {
		seen[r.ID]++
		if r.Status != "succeeded" {
			t.Errorf("task %s: %s: %s", r.ID, r.Status, r.Error)
		}
		if len(r.Nodes) == 0 || r.Nodes[len(r.Nodes)-1] != r.Node || len(r.Nodes) != r.Failovers+1 {
			t.Errorf("task %s: node %q, nodes %v, failovers %d: want nodes to end with node, one more than failovers", r.ID, r.Node, r.Nodes, r.Failovers)
		}
		for _, nd := range r.Nodes {
			if _, ok := ids[nd]; !ok {
				t.Errorf("task %s ran on %q, which is none of the nodes %v", r.ID, nd, ids)
			}
			ran[nd]++
		}
		if r.Failovers > 0 {
			failedOver++
		}
	}
	for i := range n {
		if id := fmt.Sprintf("t%02d", i); seen[id] != 1 {
			t.Errorf("task %s ended %d times in the results, want exactly once", id, seen[id])
		}
	}
	for id, i := range ids {
		if ran[id] == 0 {
			t.Errorf("node %d (%s) ran no task (tasks per node: %v)", i+1, id, ran)
		}
	}
	if failedOver == 0 {
		t.Errorf("no task failed over although node 3 was killed and node 2 restarted (tasks per node: %v)", ran)
	}
	t.Logf("tasks per node %v, %d tasks failed over", ran, failedOver)
}

// checkFleetEffects: each task's POST reached the upstream under exactly one key.
func checkFleetEffects(t *testing.T, u *upstream, n int) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	deliveries := 0
	for i := range n {
		path := fmt.Sprintf("POST /effects/t%02d", i)
		keys := slices.Compact(slices.Sorted(slices.Values(u.keys[path])))
		deliveries += len(u.keys[path])
		if len(keys) != 1 || keys[0] == "" {
			t.Errorf("%s reached the upstream under keys %q, want exactly one Idempotency-Key", path, u.keys[path])
		}
	}
	t.Logf("%d deliveries of %d effects", deliveries, n)
}

// TestTemporalCancelKillsStep: cancelling a task's workflow cancels its running step (the
// activity's heartbeat carries the cancellation), which kills the command in the sandbox; the
// sandbox is released and the run reports the task interrupted, long before the command
// would have ended.
func TestTemporalCancelKillsStep(t *testing.T) {
	addr := startTemporalDev(t)
	d := startDaemonWith(t, fmt.Sprintf("[temporal]\naddress = %q\nmax_tasks = 1\n", addr))
	d.createPool("bb", busyboxImage, 1, "--max", "2")
	dir := shortTempDir(t)
	pfile := filepath.Join(dir, "p.yaml")
	os.WriteFile(pfile, []byte("name: cancel\npool: bb\nsteps:\n  - name: long\n    run: [sleep, \"300\"]\n"), 0o644)
	var out, errOut strings.Builder
	run := exec.Command(d.env.bin, "-o", "json", "run", pfile, "--engine", "temporal://"+addr, "--node-timeout", "3s")
	run.Stdout, run.Stderr = &out, &errOut
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	testutil.WaitFor(t, 60*time.Second, 50*time.Millisecond, "the step to run", func() bool {
		sbs, err := d.client().Sandboxes(t.Context())
		if err != nil || len(sbs) != 1 {
			return false
		}
		ps, _, code := d.cliRaw("exec", sbs[0].ID, "--", "ps")
		return code == 0 && strings.Contains(ps, "sleep 300")
	})
	tc, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	open, err := tc.ListOpenWorkflow(t.Context(), &workflowservice.ListOpenWorkflowExecutionsRequest{Namespace: "default"})
	if err != nil || len(open.Executions) != 1 {
		t.Fatalf("open workflows: %v %v", open, err)
	}
	start := time.Now()
	if err := tc.CancelWorkflow(t.Context(), open.Executions[0].Execution.WorkflowId, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = run.Process.Kill()
		t.Fatalf("the run did not end within 60 s of the cancellation; stderr: %s", errOut.String())
	}
	t.Logf("run ended %s after the cancellation", time.Since(start))
	if !strings.Contains(out.String(), `"status":"interrupted"`) {
		t.Fatalf("run output: %s\nstderr: %s", out.String(), errOut.String())
	}
	if sbs, err := d.client().Sandboxes(t.Context()); err != nil || len(sbs) != 0 {
		t.Fatalf("sandboxes still leased after the cancellation: %+v %v", sbs, err)
	}
}
