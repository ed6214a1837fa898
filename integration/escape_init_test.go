package integration

// Escape suite, part "host file access and the init" (issue 11.2, 11.3): a hostile process in
// a real sandbox attacks the host's cp, the init's socket, the init itself (signals, ptrace,
// /proc/1) and the pid the host holds for it. Each case asserts the attack is refused with a
// clear error, the host canary or log is untouched, or the lease is fenced.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// runDir is the host directory mounted at /.deltabox/run in a sandbox.
func (d *daemon) runDir(container string) string {
	return filepath.Join(d.root, "pool", "containers", container, "run")
}

// copyIn copies a file of testdata into the sandbox at dest.
func (d *daemon) copyIn(id, name, dest string) {
	d.t.Helper()
	d.cli("cp", filepath.Join("testdata", name), id+":"+dest)
}

func (d *daemon) inspect(id string) api.Sandbox {
	d.t.Helper()
	var sb api.Sandbox
	d.cliJSON(&sb, "inspect", id)
	return sb
}

// TestEscapeRelayReplacingInitSocket: tenant A replaces /.deltabox/run/init.sock with a relay
// that logs requests and fakes the init's "kill". The host refuses to talk to it (its peer is
// not the init), release kills it through the cgroup, and tenant B's env never reaches it.
func TestEscapeRelayReplacingInitSocket(t *testing.T) {
	d := startDaemon(t)
	d.createPool("relay", pythonImage, 1, "--max", "1")
	a := d.lease("relay")
	d.copyIn(a.ID, "relay.py", "/tmp/relay.py")
	d.cli("exec", a.ID, "--", "python3", "/tmp/relay.py")
	run := d.runDir(a.Container)
	relayLog := filepath.Join(run, "relay.log")
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the relay to take the socket", func() bool {
		_, err := os.Stat(filepath.Join(run, "real.sock"))
		return err == nil
	})
	testutil.WaitFor(t, 5*time.Second, 20*time.Millisecond, "the relay to listen", func() bool {
		_, err := os.Stat(relayLog)
		return err == nil
	})
	_, errOut, code := d.cliRaw("exec", a.ID, "--env", "SECRET_A=tenant-a-secret", "--", "true")
	if code == 0 || !strings.Contains(errOut, "not by the sandbox init") {
		t.Fatalf("exec through the relay: exit %d, %q; want a refusal naming the socket's peer", code, errOut)
	}
	if data, _ := os.ReadFile(relayLog); len(data) != 0 {
		t.Fatalf("the relay received a request: %q", data)
	}
	d.cli("release", a.ID)
	d.waitReady("relay", 1, 60*time.Second)
	b := d.lease("relay", "--env", "TOKEN_B=tenant-b-secret")
	if out := d.cli("exec", b.ID, "--env", "PASS_B=tenant-b-exec", "--", "sh", "-c", "echo $TOKEN_B"); out != "tenant-b-secret\n" {
		t.Fatalf("tenant B's exec: %q", out)
	}
	if b.Container == a.Container {
		t.Errorf("the sandbox whose init socket was replaced went back to the pool")
	}
	if data, _ := os.ReadFile(relayLog); strings.Contains(string(data), "tenant-b") {
		t.Fatalf("tenant B's secrets reached the relay: %q", data)
	}
	if out, _ := exec.Command("pgrep", "-f", "/tmp/relay.py").Output(); len(out) != 0 {
		t.Fatalf("the relay survived release: pids %s", out)
	}
}

// TestEscapeSignalsAndPtraceOfInit: every way a sandbox process reaches its init by signal,
// ptrace or /proc/1 fails, and the init and daemon keep serving.
func TestEscapeSignalsAndPtraceOfInit(t *testing.T) {
	d := startDaemon(t)
	d.createPool("pid1", pythonImage, 1)
	l := d.lease("pid1")
	pid := d.inspect(l.ID).InitPid
	for _, sig := range []string{"TERM", "QUIT", "INT", "HUP", "ABRT", "USR1", "PIPE", "TSTP", "KILL", "STOP"} {
		d.cli("exec", l.ID, "--", "sh", "-c", "kill -"+sig+" 1; sleep 0.05")
		if out := d.cli("exec", l.ID, "--", "echo", "alive"); out != "alive\n" {
			t.Fatalf("after kill -%s 1: %q", sig, out)
		}
	}
	if got := d.inspect(l.ID).InitPid; got != pid {
		t.Fatalf("init pid changed from %d to %d", pid, got)
	}
	ptrace := `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for req in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
    r = libc.ptrace(req, 1, None, None)
    print(r, ctypes.get_errno())`
	if out := d.cli("exec", l.ID, "--", "python3", "-c", ptrace); out != "-1 1\n-1 1\n" {
		t.Errorf("ptrace of the init from inside: %q, want EPERM twice", out)
	}
	// No link in /proc/1/fd opens or resolves; /mem and /environ refuse.
	procfs := `import os
for p, mode in (("/proc/1/fd/1", "w"), ("/proc/1/fd/2", "w"), ("/proc/1/mem", "r"), ("/proc/1/environ", "r")):
    try:
        open(p, mode).write("PID1-MARKER") if mode == "w" else open(p).read(16)
        print(p, "opened")
    except PermissionError:
        print(p, "refused")
try:
    os.readlink("/proc/1/fd/1"); print("readlink ok")
except PermissionError:
    print("readlink refused")`
	want := "/proc/1/fd/1 refused\n/proc/1/fd/2 refused\n/proc/1/mem refused\n/proc/1/environ refused\nreadlink refused\n"
	if out := d.cli("exec", l.ID, "--", "python3", "-c", procfs); out != want {
		t.Errorf("/proc/1 from inside:\n%s\nwant:\n%s", out, want)
	}
	logFile := filepath.Join(filepath.Dir(d.runDir(l.Container)), "init.log")
	if data, _ := os.ReadFile(logFile); strings.Contains(string(data), "PID1-MARKER") {
		t.Fatalf("a sandbox process wrote to the host file %s", logFile)
	}
	d.cli("info")
}

// TestEscapeInitDeathFencesLease: when the init dies (here: signalled from the host, and a
// queued SIGSEGV from inside, which Go cannot ignore), the lease is fenced at once: calls
// fail with a clear failed-precondition error, and release destroys the sandbox.
func TestEscapeInitDeathFencesLease(t *testing.T) {
	d := startDaemon(t)
	d.createPool("fence", pythonImage, 2)
	a, b := d.lease("fence"), d.lease("fence")
	// A queued fault signal (si_code SI_QUEUE) from inside, which Go's runtime cannot
	// ignore: the init survives it, or dies and the lease is fenced; nothing else.
	d.cliRaw("exec", b.ID, "--", "python3", "-c", "import ctypes; ctypes.CDLL(None).sigqueue(1, 11, None)")
	testutil.WaitFor(t, 5*time.Second, 20*time.Millisecond, "the init to survive or the lease to be fenced", func() bool {
		_, errOut, code := d.cliRaw("exec", b.ID, "--", "true")
		return code == 0 || strings.Contains(errOut, "sandbox failed")
	})
	pid := d.inspect(a.ID).InitPid
	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, 10*time.Millisecond, "the lease to be fenced", func() bool {
		for _, line := range strings.Split(d.logs.String(), "\n") {
			if strings.Contains(line, "sandbox fenced") && strings.Contains(line, a.Container) {
				return true
			}
		}
		return false
	})
	exited := "init (pid " + strconv.Itoa(int(pid)) + ") exited"
	if sb := d.inspect(a.ID); sb.State != "failed" || !strings.Contains(sb.Reason, exited+": killed by SIGKILL") {
		t.Errorf("inspect of a fenced sandbox: state %q, reason %q; want failed naming the init's exit and its signal", sb.State, sb.Reason)
	}
	mustContain(t, "inspect of a fenced sandbox", d.cli("inspect", a.ID), "State:", "failed: its "+exited)
	mustContain(t, "ls with a fenced sandbox", d.cli("ls"), "failed: its "+exited)
	local := filepath.Join(shortTempDir(t), "f")
	os.WriteFile(local, []byte("x"), 0o644)
	for what, args := range map[string][]string{
		"exec":       {"exec", a.ID, "--", "true"},
		"cp to":      {"cp", local, a.ID + ":/tmp/f"},
		"cp from":    {"cp", a.ID + ":/etc/hostname", filepath.Join(shortTempDir(t), "out")},
		"checkpoint": {"checkpoint", "create", a.ID},
	} {
		_, errOut, code := d.cliRaw(args...)
		if code == 0 {
			t.Errorf("%s on a fenced sandbox succeeded: %s", what, d.logTail())
			continue
		}
		mustContain(t, what+" on a fenced sandbox", errOut, "sandbox failed", "init (pid "+strconv.Itoa(int(pid))+") exited")
	}
	d.cli("release", a.ID)
	testutil.WaitFor(t, 20*time.Second, 50*time.Millisecond, "the fenced sandbox to be destroyed", func() bool {
		_, err := os.Stat(filepath.Dir(d.runDir(a.Container)))
		return os.IsNotExist(err)
	})
	c := d.lease("fence")
	if c.Container == a.Container {
		t.Fatalf("the fenced sandbox was leased again")
	}
	d.cli("exec", c.ID, "--", "true")
}

// TestEscapeDeviceSwappedInDuringCopy: a sandbox swaps a regular file with a device node
// (or FIFO) while the host copies it out; the host never reads the device or blocks, and
// every copy either is the regular file, skips the special file, or fails naming the swap.
func TestEscapeDeviceSwappedInDuringCopy(t *testing.T) {
	d := startDaemon(t)
	d.createPool("swap", pythonImage, 1)
	l := d.lease("swap")
	d.copyIn(l.ID, "swap.py", "/tmp/swap.py")
	kind := strings.TrimSpace(d.cli("exec", l.ID, "--", "python3", "/tmp/swap.py"))
	want := strings.Repeat("d", 4096)
	copied, refused := 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; time.Now().Before(deadline) && (refused < 3 || copied < 3); i++ {
		out := filepath.Join(shortTempDir(t), "out")
		start := time.Now()
		_, errOut, code := d.cliRaw("cp", l.ID+":/tmp/r/f", out)
		if time.Since(start) > 10*time.Second {
			t.Fatalf("cp %d blocked for %s", i, time.Since(start))
		}
		data, rerr := os.ReadFile(out)
		switch {
		case code != 0:
			mustContain(t, "cp of a swapped file", errOut, "replaced while being copied")
			refused++
		case rerr == nil && string(data) != want:
			t.Fatalf("cp %d returned something else than the file (%s swapped in): %q", i, kind, data[:min(len(data), 200)])
		case rerr == nil:
			copied++
		}
	}
	t.Logf("special file: %s; %d copies, %d refused", kind, copied, refused)
	if refused == 0 {
		t.Fatalf("no cp raced with a swap in 30s; the test proves nothing")
	}
	d.cli("info")
}

// initPidOf finds the host pid of the init of container cid (PID 1 of its pid namespace).
func initPidOf(t *testing.T, cid string) int {
	t.Helper()
	var found int
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the init of "+cid, func() bool {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cg, _ := os.ReadFile("/proc/" + e.Name() + "/cgroup")
			status, _ := os.ReadFile("/proc/" + e.Name() + "/status")
			if strings.Contains(string(cg), cid) && strings.Contains(string(status), "\nNSpid:\t"+e.Name()+"\t1\n") {
				found = pid
				return true
			}
		}
		return false
	})
	return found
}

// TestEscapeReadySandboxWhoseInitDiesIsDestroyed: a ready (unleased) sandbox whose init dies
// is taken out of the pool and destroyed at once; the next lease gets a working sandbox.
func TestEscapeReadySandboxWhoseInitDiesIsDestroyed(t *testing.T) {
	d := startDaemon(t)
	d.createPool("ready", busyboxImage, 1, "--max", "2")
	entries, err := os.ReadDir(filepath.Join(d.root, "pool", "containers"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("want one container dir: %v %v", entries, err)
	}
	cid := entries[0].Name()
	if err := syscall.Kill(initPidOf(t, cid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, 20*time.Millisecond, "the dead ready sandbox to be destroyed", func() bool {
		_, err := os.Stat(filepath.Join(d.root, "pool", "containers", cid))
		return os.IsNotExist(err)
	})
	mustContain(t, "daemon log", d.logs.String(), "sandbox fenced: its init exited while it was ready")
	d.waitReady("ready", 1, 60*time.Second)
	l := d.lease("ready")
	if l.Container == cid {
		t.Fatalf("the sandbox whose init died was leased")
	}
	if out := d.cli("exec", l.ID, "--", "echo", "ok"); out != "ok\n" {
		t.Fatalf("exec in the new sandbox: %q", out)
	}
}
