package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/client"
)

const (
	busyboxImage = "deltabox.local/busybox:latest"
	pythonImage  = "deltabox.local/python:3"
)

func (d *daemon) client() *client.Client { return client.New(d.address) }

// createPool creates a pool through the CLI and waits until min-ready sandboxes are ready.
func (d *daemon) createPool(name, image string, minReady int, extra ...string) {
	d.t.Helper()
	args := append([]string{"pool", "create", name, "--image", image, "--min-ready", fmt.Sprint(minReady)}, extra...)
	d.cli(args...)
	d.waitReady(name, minReady, 60*time.Second)
}

func (d *daemon) waitReady(name string, n int, timeout time.Duration) {
	d.t.Helper()
	testutil.WaitFor(d.t, timeout, 20*time.Millisecond, fmt.Sprintf("%d ready sandboxes in %s", n, name), func() bool {
		p, err := d.client().Pool(context.Background(), name)
		return err == nil && p.Ready >= n
	})
}

func (d *daemon) lease(pool string, args ...string) api.Lease {
	d.t.Helper()
	var l api.Lease
	d.cliJSON(&l, append([]string{"lease", "--pool", pool}, args...)...)
	return l
}

func TestLeaseExecCopyRelease(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 2, "--env", "FROM_TEMPLATE=t")
	l := d.lease("bb", "--env", "FROM_LEASE=l", "--label", "job=42")
	if l.Cold || l.ID == "" || l.Pool != "bb" {
		t.Fatalf("unexpected lease: %+v", l)
	}
	if out := d.cli("exec", l.ID, "--env", "FROM_EXEC=e", "--", "sh", "-c", "echo $FROM_TEMPLATE$FROM_LEASE$FROM_EXEC"); out != "tle\n" {
		t.Errorf("env layering: got %q", out)
	}
	if _, _, code := d.cliRaw("exec", l.ID, "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exec exit code: got %d, want 7", code)
	}
	start := time.Now()
	if _, _, code := d.cliRaw("exec", l.ID, "--timeout", "300ms", "--", "sh", "-c", "sleep 30 & sleep 30"); code != 137 || time.Since(start) > 10*time.Second {
		t.Errorf("timeout: exit %d after %s", code, time.Since(start))
	}
	local := filepath.Join(shortTempDir(t), "in")
	os.MkdirAll(filepath.Join(local, "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "sub", "f.txt"), []byte("payload"), 0o600)
	d.cli("cp", local, l.ID+":/tmp/in")
	if out := d.cli("exec", l.ID, "--", "cat", "/tmp/in/sub/f.txt"); out != "payload" {
		t.Errorf("cp to sandbox: got %q", out)
	}
	back := filepath.Join(shortTempDir(t), "back")
	d.cli("cp", l.ID+":/tmp/in", back)
	if data, _ := os.ReadFile(filepath.Join(back, "sub", "f.txt")); string(data) != "payload" {
		t.Errorf("cp from sandbox: got %q", data)
	}
	var sb api.Sandbox
	d.cliJSON(&sb, "inspect", l.ID)
	if sb.Labels["job"] != "42" {
		t.Errorf("labels not bound: %+v", sb.Labels)
	}
	d.cli("release", l.ID)
	_, errOut, code := d.cliRaw("exec", l.ID, "--", "true")
	if code != 1 || !strings.Contains(errOut, "not_found") {
		t.Errorf("exec after release: exit %d, %q", code, errOut)
	}
	_, err := d.client().Exec(context.Background(), l.ID, api.ExecRequest{Argv: []string{"true"}}, nil, os.Stdout, os.Stderr)
	if !errdefs.IsNotFound(err) {
		t.Errorf("exec after release through the API: want not_found, got %v", err)
	}
}

func TestExecStdinAndJSON(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	l := d.lease("bb")
	cmd := runCLIStdin(d.env.bin, "hello stdin", "--address", d.address, "exec", "-i", l.ID, "--", "tr", "a-z", "A-Z")
	if cmd != "HELLO STDIN" {
		t.Errorf("stdin: got %q", cmd)
	}
	out, _, code := d.cliRaw("-o", "json", "exec", l.ID, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if code != 3 {
		t.Errorf("json exec exit code %d, want 3", code)
	}
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		lines = append(lines, m)
	}
	// stdout and stderr are separate pipes: their relative order is not defined.
	got := map[string]any{}
	for _, l := range lines {
		for k, v := range l {
			got[k] = v
		}
	}
	if len(lines) != 3 || got["stdout"] != "out\n" || got["stderr"] != "err\n" || lines[2]["exit"] == nil {
		t.Errorf("unexpected JSON lines: %v", lines)
	}
}

func TestReleaseLeaksNothing(t *testing.T) {
	d := startDaemon(t)
	d.createPool("one", busyboxImage, 1, "--max", "1")
	first := d.lease("one", "--env", "SECRET=first-lease")
	d.cli("exec", first.ID, "--", "sh", "-c", "echo leaked > /root/leak.txt; touch /tmp/leak2")
	d.cli("exec", first.ID, "--", "sh", "-c", "nohup sleep 1000 >/dev/null 2>&1 &")
	d.cli("release", first.ID)
	d.waitReady("one", 1, 30*time.Second)
	second := d.lease("one")
	if second.ID == first.ID {
		t.Fatalf("re-lease returned the released ID %s", first.ID)
	}
	out := d.cli("exec", second.ID, "--", "sh", "-c", "ls /root/leak.txt /tmp/leak2 2>/dev/null; echo SECRET=$SECRET; ps -o args | grep 'sleep 1000' | grep -v grep || true")
	if strings.Contains(out, "leak") || strings.Contains(out, "first-lease") || strings.Contains(out, "sleep 1000") {
		t.Fatalf("previous lease leaked into the next one:\n%s", out)
	}
}

func TestConcurrentLeasesAreDistinct(t *testing.T) {
	d := startDaemon(t)
	d.createPool("many", busyboxImage, 10, "--max", "60")
	var mu sync.Mutex
	ids, containers := map[string]bool{}, map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := d.client().Lease(context.Background(), "many", api.LeaseRequest{})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if ids[l.ID] || containers[l.Container] {
				errs <- fmt.Errorf("lease handed out twice: %s / %s", l.ID, l.Container)
			}
			ids[l.ID], containers[l.Container] = true, true
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(ids) != 50 || len(containers) != 50 {
		t.Fatalf("want 50 distinct leases, got %d IDs and %d containers", len(ids), len(containers))
	}
}

func TestLeaseSurvivesRestart(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 2)
	l := d.lease("bb")
	d.cli("exec", l.ID, "--", "sh", "-c", "echo kept > /root/state.txt")
	d.stop()
	d.start()
	if out := d.cli("exec", l.ID, "--", "cat", "/root/state.txt"); out != "kept\n" {
		t.Fatalf("after restart: got %q", out)
	}
	d.waitReady("bb", 2, 30*time.Second)
	var sbs []api.Sandbox
	d.cliJSON(&sbs, "ls")
	if len(sbs) != 1 || sbs[0].ID != l.ID {
		t.Fatalf("want exactly the one leased sandbox after restart, got %+v", sbs)
	}
	d.kill() // crash: no clean shutdown
	d.start()
	d.cli("exec", l.ID, "--", "true")
}

// TestPoolRefills checks that the filler brings a drained pool back to min_ready. How fast
// (10 within 3 s) is a benchmark target (BenchmarkRefill, the Targets table of
// docs/benchmarks.md): a stopwatch in a test fails for the machine's load, not for the code.
func TestPoolRefills(t *testing.T) {
	d := startDaemon(t)
	d.createPool("refill", busyboxImage, 10, "--max", "30")
	for range 10 {
		d.lease("refill")
	}
	start := time.Now()
	d.waitReady("refill", 10, time.Minute)
	t.Logf("refilled 10 sandboxes in %s", time.Since(start))
}

func TestPoolBadInput(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	_, errOut, code := d.cliRaw("pool", "create", "ghost", "--image", "deltabox.local/ghost:1")
	if code != 1 || !strings.Contains(errOut, "deltabox.local/ghost:1") {
		t.Errorf("missing image: exit %d, %q", code, errOut)
	}
	if _, err := d.client().Lease(ctx, "nope", api.LeaseRequest{}); !errdefs.IsNotFound(err) {
		t.Errorf("lease from unknown pool: want not_found, got %v", err)
	}
	_, errOut, code = d.cliRaw("pool", "create", "x", "--image", busyboxImage, "--memory", "12parsecs")
	if code != 2 || !strings.Contains(errOut, "12parsecs") {
		t.Errorf("--memory 12parsecs: exit %d, %q", code, errOut)
	}
	_, err := d.client().CreatePool(ctx, api.Template{Name: "x", Image: busyboxImage, MemoryBytes: -5})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("negative memory through the API: want invalid_argument, got %v", err)
	}
}

// TestCopyRefusesEscapes: cp follows a sandbox's symlinks inside its root only (docker cp's
// semantics, issue 19): a symlink to a host path reaches the same path inside the sandbox,
// never the host's, and ".." in the path is refused.
func TestCopyRefusesEscapes(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	l := d.lease("bb")
	canaryDir := shortTempDir(t)
	canary := filepath.Join(canaryDir, "canary")
	os.WriteFile(canary, []byte("host"), 0o644)
	src := filepath.Join(shortTempDir(t), "f")
	os.WriteFile(src, []byte("evil"), 0o644)
	d.cli("exec", l.ID, "--", "ln", "-s", canaryDir, "/tmp/escape")
	d.cli("exec", l.ID, "--", "ln", "-s", "../../../../../../../.."+canaryDir, "/tmp/climb")
	if _, errOut, code := d.cliRaw("cp", src, l.ID+":/../../"+canaryDir+"/canary"); code == 0 || !strings.Contains(errOut, "climbs out") {
		t.Errorf("cp to a path with ..: exit %d, %q", code, errOut)
	}
	// The symlinks' targets do not exist inside the sandbox yet: the copies fail.
	for _, dest := range []string{"/tmp/escape/canary", "/tmp/escape/new", "/tmp/climb/new"} {
		if _, errOut, code := d.cliRaw("cp", src, l.ID+":"+dest); code == 0 {
			t.Errorf("cp to %s succeeded with no %s in the sandbox: %q", dest, canaryDir, errOut)
		}
	}
	if _, _, code := d.cliRaw("cp", l.ID+":/tmp/escape/canary", filepath.Join(shortTempDir(t), "x")); code == 0 {
		t.Errorf("cp from a symlink to a host path read something")
	}
	// Once the sandbox has that directory, the same copies land in it, never on the host.
	d.cli("exec", l.ID, "--", "mkdir", "-p", canaryDir)
	for _, dest := range []string{"/tmp/escape/canary", "/tmp/escape/new", "/tmp/climb/new2"} {
		d.cli("cp", src, l.ID+":"+dest)
	}
	if out := d.cli("exec", l.ID, "--", "cat", canaryDir+"/canary", canaryDir+"/new", canaryDir+"/new2"); out != "evilevilevil" {
		t.Errorf("the sandbox's %s holds %q, want the three copies", canaryDir, out)
	}
	back := filepath.Join(shortTempDir(t), "back")
	d.cli("cp", l.ID+":/tmp/escape/canary", back)
	if data, _ := os.ReadFile(back); string(data) != "evil" {
		t.Errorf("cp from /tmp/escape/canary read %q, want the sandbox's file", data)
	}
	if data, _ := os.ReadFile(canary); string(data) != "host" {
		t.Fatalf("host canary changed: %q", data)
	}
	for _, n := range []string{"new", "new2"} {
		if _, err := os.Stat(filepath.Join(canaryDir, n)); err == nil {
			t.Fatalf("cp created %s on the host through a sandbox symlink", n)
		}
	}
}

func TestLimitsContainOneSandbox(t *testing.T) {
	d := startDaemon(t)
	d.createPool("tight", pythonImage, 2, "--memory", "64m", "--pids", "64")
	bomb, other := d.lease("tight"), d.lease("tight")
	var before api.Checkpoint
	d.cliJSON(&before, "checkpoint", "create", bomb.ID, "-m", "before the bomb")
	d.cli("exec", "-d", bomb.ID, "--", "sleep", "600") // outlives the bomb: the rollback must stop it
	// Fork bomb: the pids limit stops it (the shell that starts it exits at once; the
	// bomb's processes go on, forking into every pid that frees up).
	d.cliRaw("exec", bomb.ID, "--timeout", "3s", "--", "sh", "-c", "b() { b | b & }; b")
	// OOM: the kernel kills the allocation inside the sandbox.
	_, _, code := d.cliRaw("exec", bomb.ID, "--timeout", "20s", "--", "python3", "-c", "x = bytearray(512 << 20); print(len(x))")
	if code == 0 {
		t.Errorf("allocating 512 MiB under a 64 MiB limit succeeded")
	}
	if out := d.cli("exec", other.ID, "--", "echo", "alive"); out != "alive\n" {
		t.Errorf("neighbour sandbox broken: %q", out)
	}
	// The bomb dies out only by chance (a shell whose fork fails exits, which frees a pid
	// for another's fork: it took over 20 s once in CI). A rollback ends it: it kills every
	// process started since the checkpoint, through the freezer, where none can fork.
	var rb api.RollbackResult
	d.cliJSON(&rb, "rollback", bomb.ID, "--to", before.ID)
	if rb.ProcessesStopped == 0 {
		t.Errorf("rollback after the fork bomb stopped no process (the sleep at least): %+v", rb)
	}
	// The killed processes exit and are reaped by the sandbox's init once it is thawed.
	testutil.WaitFor(t, 5*time.Second, 20*time.Millisecond, "the bombed sandbox to run a command after the rollback", func() bool {
		_, _, code := d.cliRaw("exec", bomb.ID, "--timeout", "3s", "--", "true")
		return code == 0
	})
	if n, ps := d.psCount(bomb.ID, "sleep 600"); n != 0 {
		t.Errorf("after the rollback the sleep started since the checkpoint still runs:\n%s", ps)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	d := startDaemonWith(t, "[metrics]\naddress = \"127.0.0.1:19464\"\n")
	d.createPool("m", busyboxImage, 1)
	d.lease("m")
	body := httpGet(t, "http://127.0.0.1:19464/metrics")
	for _, want := range []string{`deltabox_pool_ready{pool="m"}`, `deltabox_pool_leased{pool="m"} 1`, "deltabox_lease_duration_seconds_bucket"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func runCLIStdin(bin, stdin string, args ...string) string {
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, _ := cmd.Output()
	return string(out)
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}

func TestExecThroughContainerd(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	l := d.lease("bb", "--env", "FROM_LEASE=l")
	if out := d.cli("exec", l.ID, "--via", "containerd", "--", "sh", "-c", "echo $FROM_LEASE"); out != "l\n" {
		t.Errorf("exec via containerd: %q", out)
	}
	if _, _, code := d.cliRaw("exec", l.ID, "--via", "containerd", "--", "sh", "-c", "exit 5"); code != 5 {
		t.Errorf("exit code via containerd: %d", code)
	}
	// With the init's socket gone, exec falls back to containerd's task exec.
	sock := filepath.Join(d.root, "pool", "containers", l.Container, "run", "init.sock")
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if out := d.cli("exec", l.ID, "--", "echo", "fallback"); out != "fallback\n" {
		t.Errorf("fallback exec: %q", out)
	}
	if _, _, code := d.cliRaw("exec", l.ID, "--via", "init", "--", "true"); code != 1 {
		t.Errorf("--via init without an init socket: exit %d, want 1", code)
	}
}
