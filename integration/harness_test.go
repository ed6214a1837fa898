// Package integration drives a real DeltaBox daemon, on a real (private) containerd, through
// the real CLI binary. `make test` builds the binaries, starts containerd and imports the
// images, then exports DELTABOX_BIN, DELTABOX_CONTAINERD_ADDRESS and friends. With CI=true a
// missing piece fails the tests instead of skipping them.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// env names the binaries and services `make test` prepared.
type env struct {
	bin        string // deltabox binary
	containerd string // containerd socket
}

func requireEnv(t testing.TB) env {
	t.Helper()
	testutil.RequiresRoot(t)
	return env{
		bin:        testutil.RequiresEnv(t, "DELTABOX_BIN"),
		containerd: testutil.RequiresEnv(t, "DELTABOX_CONTAINERD_ADDRESS"),
	}
}

// daemon is one running `deltabox daemon` with its own state root and socket.
type daemon struct {
	t       testing.TB
	env     env
	root    string
	address string
	cmd     *exec.Cmd
	logs    *testutil.SyncBuffer
	exited  chan error
	net     testNet
	args    []string // extra daemon arguments, kept for restarts
	extra   []string // extra environment of the next start (e.g. DELTABOX_FAILPOINTS)
}

// startDaemon starts a daemon in a fresh state root and waits until its API answers.
func startDaemon(t testing.TB, extraArgs ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, "", extraArgs...)
}

// netSeq numbers the test daemons' private sandbox networks (bridge and /24 subnet each).
var netSeq atomic.Int32

// startDaemonWith starts a daemon whose config file holds extraConfig (TOML) on top of a
// private sandbox network, so that daemons of one test run never share bridges or addresses.
func startDaemonWith(t testing.TB, extraConfig string, extraArgs ...string) *daemon {
	t.Helper()
	return startDaemonOn(t, requireEnv(t), extraConfig, extraArgs...)
}

// startDaemonOn is startDaemonWith on the containerd of e (tests of two nodes use two).
func startDaemonOn(t testing.TB, e env, extraConfig string, extraArgs ...string) *daemon {
	t.Helper()
	dir := shortTempDir(t)
	d := &daemon{t: t, env: e, root: filepath.Join(dir, "root"), address: filepath.Join(dir, "api.sock")}
	d.net = testNetwork(os.Getpid() + int(netSeq.Add(1)))
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(d.net.toml()+"\n"+withTestDisk(extraConfig)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyNodeContainers(t, e, d.root); unmountRestoreArea(d.root); d.net.uninstall(t) })
	d.args = append([]string{"--config", cfg}, extraArgs...)
	d.start()
	t.Cleanup(d.stop)
	return d
}

// testDisk is the sandbox disk of test daemons whose config sets no [sandbox]: every disk
// is reserved in full on the state root (docs/operations.md), and the benchmarks keep up to
// 100 sandboxes, which the default size would not fit on a test machine.
const testDisk = "[sandbox]\ndisk = \"128m\"\n"

// withTestDisk adds testDisk to a config that has no [sandbox] section.
func withTestDisk(config string) string {
	if strings.Contains(config, "[sandbox]") {
		return config
	}
	return config + "\n" + testDisk
}

func (d *daemon) start() {
	d.t.Helper()
	// Tests read the daemon's debug spans. Benchmarks measure the daemon as it runs by
	// default (log level info): its debug lines, a dozen per checkpoint and rollback, go
	// through a pipe to this process, the benchmark's client, which competes for the same
	// two cores (0.2-0.35 ms of a rollback with processes, docs/benchmarks.md, session 20).
	// DELTABOX_TEST_LOG_LEVEL=debug brings the spans back for an analysis.
	level := "debug"
	if _, bench := d.t.(*testing.B); bench {
		level = "info"
	}
	if v := os.Getenv("DELTABOX_TEST_LOG_LEVEL"); v != "" {
		level = v
	}
	args := append([]string{"daemon", "--root", d.root, "--address", d.address,
		"--containerd-address", d.env.containerd, "--log-level", level}, d.args...)
	d.logs = &testutil.SyncBuffer{} // written by the command's copier while tests read it
	d.cmd = exec.Command(d.env.bin, args...)
	d.cmd.Env = append(os.Environ(), d.extra...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	closeLog := func() error { return nil }
	if path := os.Getenv("DELTABOX_TEST_DAEMON_LOG"); path != "" { // keep the logs for a look
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			d.t.Fatal(err)
		}
		closeLog = f.Close             // once the daemon exited: a cleanup could close it under a restarted daemon
		w := io.MultiWriter(d.logs, f) // one writer for both, so one goroutine writes at a time
		d.cmd.Stdout, d.cmd.Stderr = w, w
	}
	if err := d.cmd.Start(); err != nil {
		d.t.Fatalf("start daemon: %v", err)
	}
	d.exited = make(chan error, 1)
	go func(cmd *exec.Cmd) { err := cmd.Wait(); _ = closeLog(); d.exited <- err }(d.cmd)
	testutil.WaitFor(d.t, 30*time.Second, 20*time.Millisecond, "daemon API to answer", func() bool {
		select {
		case err := <-d.exited:
			d.exited <- err
			d.t.Fatalf("daemon exited early: %v\n%s", err, d.logs)
		default:
		}
		_, _, code := d.cliRaw("info")
		return code == 0
	})
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exited:
		if err != nil {
			d.t.Errorf("daemon exit: %v\n%s", err, d.logs)
		}
	case <-time.After(40 * time.Second):
		_ = d.cmd.Process.Kill()
		d.t.Errorf("daemon did not stop within 40s after SIGTERM\n%s", d.logs)
	}
	d.cmd = nil
}

// kill stops the daemon with SIGKILL, as a crash would.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.exited
	d.cmd = nil
}

// cliRaw runs the CLI against this daemon and returns stdout, stderr and the exit code.
func (d *daemon) cliRaw(args ...string) (string, string, int) {
	return runCLI(d.env.bin, append([]string{"--address", d.address}, args...)...)
}

// cli runs the CLI and fails the test unless it exits 0.
func (d *daemon) cli(args ...string) string {
	d.t.Helper()
	out, errOut, code := d.cliRaw(args...)
	if code != 0 {
		d.t.Fatalf("deltabox %s: exit %d\nstderr: %s\nstdout: %s\ndaemon log tail:\n%s", strings.Join(args, " "), code, errOut, out, d.logTail())
	}
	return out
}

// cliJSON runs the CLI with -o json and decodes its output into v.
func (d *daemon) cliJSON(v any, args ...string) {
	d.t.Helper()
	out := d.cli(append([]string{"-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		d.t.Fatalf("decode output of deltabox %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func runCLI(bin string, args ...string) (string, string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			errOut.WriteString(err.Error())
		}
	}
	return out.String(), errOut.String(), code
}

// shortTempDir returns a temp dir with a short path (unix socket paths are limited to 107
// bytes) that other users may traverse, removed at the end of the test.
// unmountRestoreArea detaches the tmpfs a daemon stages restores on, which a daemon stopped
// cleanly unmounts itself and one killed leaves.
func unmountRestoreArea(root string) {
	_ = syscall.Unmount(filepath.Join(root, "restore-mem"), syscall.MNT_DETACH)
}

func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "dbx")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func mustContain(t testing.TB, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Fatalf("%s does not mention %q:\n%s", what, sub, s)
		}
	}
}

// logTail returns the end of the daemon's log, for failure messages.
func (d *daemon) logTail() string {
	if d.logs == nil {
		return ""
	}
	s := d.logs.String()
	if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	return s
}
