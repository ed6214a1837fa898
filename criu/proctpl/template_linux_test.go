package proctpl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// repl is a python3 process evaluating lines from a pipe, one answer line each.
type repl struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// The REPL reads with os.read on fd 0 (a blocking read(2)), so it sits in read when idle.
const replSrc = `
import os, sys
buf = b""
g = {}
while True:
    while b"\n" not in buf:
        chunk = os.read(0, 4096)
        if not chunk:
            sys.exit(0)
        buf += chunk
    line, buf = buf.split(b"\n", 1)
    try:
        r = eval(line.decode(), g)
    except SyntaxError:
        exec(line.decode(), g); r = "ok"
    except Exception as e:
        r = type(e).__name__
    os.write(1, (repr(r) + "\n").encode())
`

// pythonBinary is the real python3 executable (python3 on PATH may be a shell shim, whose
// state while it starts python is not what a test means to checkpoint).
func pythonBinary(t testing.TB) string {
	t.Helper()
	out, err := exec.Command(testutil.RequiresBinary(t, "python3"), "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

func startREPL(t testing.TB) *repl {
	t.Helper()
	cmd := exec.Command(pythonBinary(t), "-S", "-c", replSrc)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := &repl{cmd: cmd, in: in, out: bufio.NewReader(out)}
	r.eval(t, "1") // started
	return r
}

func (r *repl) eval(t testing.TB, expr string) string {
	t.Helper()
	if _, err := fmt.Fprintln(r.in, expr); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() {
		line, _ := r.out.ReadString('\n')
		done <- strings.TrimSpace(line)
	}()
	select {
	case s := <-done:
		return s
	case <-time.After(10 * time.Second):
		t.Fatalf("no answer to %q", expr)
		return ""
	}
}

func noCheck(int) error { return nil }

// checkpoint seizes pid, makes a template and resumes the original.
func checkpoint(t *testing.T, tr *Tracer, pid int) *Template {
	t.Helper()
	p, err := tr.Seize(pid, noCheck)
	if err != nil {
		t.Fatal(err)
	}
	tp := template(t, p)
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	return tp
}

// template waits for the seized p to stop and makes its template, released at cleanup.
func template(t *testing.T, p *Proc) *Template {
	t.Helper()
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	tp, err := p.Template()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.Release)
	return tp
}

// rollback kills pid and starts a copy of tp in its place; the copy is a child of the test
// (CLONE_PARENT), reaped at cleanup.
func rollback(t *testing.T, tp *Template, pid int) int {
	t.Helper()
	_ = unix.Kill(pid, unix.SIGKILL)
	c, err := tp.Copy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Kill(c, unix.SIGKILL)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(c, &ws, 0, nil)
	})
	return c
}

func TestTemplateREPLRollbackTwice(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	r := startREPL(t)
	r.eval(t, "before = 41")
	r.eval(t, "big = bytearray(50 << 20)")
	start := time.Now()
	tp := checkpoint(t, tr, r.cmd.Process.Pid)
	t.Logf("template in %s, %d bytes private", time.Since(start), tp.Bytes())
	r.eval(t, "after = 1")
	r.eval(t, "before = 0")
	if got := r.eval(t, "before"); got != "0" {
		t.Fatalf("before = %s", got)
	}
	pid := r.cmd.Process.Pid
	for i := 0; i < 2; i++ {
		start = time.Now()
		c := rollback(t, tp, pid)
		t.Logf("copy %d in %s", c, time.Since(start))
		if got := r.eval(t, "before"); got != "41" {
			t.Fatalf("rollback %d: before = %s, want 41", i, got)
		}
		if got := r.eval(t, "after"); got != "'NameError'" {
			t.Fatalf("rollback %d: after = %s, want NameError", i, got)
		}
		if got := r.eval(t, "len(big)"); got != strconv.Itoa(50<<20) {
			t.Fatalf("rollback %d: len(big) = %s", i, got)
		}
		r.eval(t, "after = 2")
		pid = c
	}
	if !tp.Alive() {
		t.Fatal("template gone after copies")
	}
}

// TestTemplateFrozenCut seizes and interrupts processes while their cgroup is frozen: once
// thawed they stop for the tracer before running on, so the cut is the frozen one.
func TestTemplateFrozenCut(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := filepath.Join("/sys/fs/cgroup/freezer", fmt.Sprintf("proctpl-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		testutil.SkipOrFail(t, "cgroup v1 freezer: %v", err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
		time.Sleep(50 * time.Millisecond)
		_ = os.Remove(dir)
	})
	tr := NewTracer()
	r := startREPL(t)
	r.eval(t, "x = 1")
	// a busy loop with no system calls, and a process asleep
	busy := exec.Command(pythonBinary(t), "-S", "-c", "while True: pass")
	busyErr := &testutil.SyncBuffer{}
	busy.Stderr = busyErr
	sleeper := exec.Command("sleep", "1000")
	for _, c := range []*exec.Cmd{busy, sleeper} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	pids := []int{r.cmd.Process.Pid, busy.Process.Pid, sleeper.Process.Pid}
	for _, pid := range pids {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	state := filepath.Join(dir, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "frozen", func() bool {
		b, _ := os.ReadFile(state)
		return strings.TrimSpace(string(b)) == "FROZEN"
	})
	var procs []*Proc
	for _, pid := range pids {
		p, err := tr.Seize(pid, noCheck)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	if err := os.WriteFile(state, []byte("THAWED"), 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var tps []*Template
	for _, p := range procs {
		tps = append(tps, template(t, p))
	}
	for _, p := range procs {
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("3 processes stopped, templated and resumed in %s after the thaw", time.Since(start))
	r.eval(t, "x = 2")
	c := rollback(t, tps[0], pids[0])
	if got := r.eval(t, "x"); got != "1" {
		t.Fatalf("x = %s after rollback, want 1", got)
	}
	for i, tp := range tps[1:] {
		c := rollback(t, tp, pids[i+1])
		time.Sleep(20 * time.Millisecond)
		if st := procState(c); st != "R" && st != "S" {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(c, &ws, unix.WNOHANG, nil)
			t.Fatalf("copy of %d (%v) is in state %q: exit %d signal %v; busy's stderr: %s", pids[i+1], []string{"busy", "sleeper"}[i], st, ws.ExitStatus(), ws.Signal(), busyErr)
		}
	}
	_ = c
}

func procState(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	s := string(data)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

// TestTemplateIgnoresSignals sends a template every catchable kind of signal: it stays
// stopped, and copies made afterwards neither die nor stop from them.
func TestTemplateIgnoresSignals(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	r := startREPL(t)
	r.eval(t, "x = 5")
	tp := checkpoint(t, tr, r.cmd.Process.Pid)
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGSTOP, unix.SIGCONT, unix.SIGUSR1, unix.SIGSEGV} {
		if err := unix.Kill(tp.Pid(), sig); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if st := procState(tp.Pid()); st != "t" {
		t.Fatalf("template state %q after signals", st)
	}
	r.eval(t, "x = 6")
	done := make(chan struct{})
	go func() {
		defer close(done)
		rollback(t, tp, r.cmd.Process.Pid)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("copy hangs; template state %q", procState(tp.Pid()))
	}
	if got := r.eval(t, "x"); got != "5" {
		t.Fatalf("x = %s", got)
	}
}

// freezeCgroup puts pid in a new cgroup v1 freezer cgroup and freezes it; thaw undoes it.
func freezeCgroup(t *testing.T, pid int) (thaw func()) {
	t.Helper()
	dir := filepath.Join("/sys/fs/cgroup/freezer", fmt.Sprintf("proctpl-test-%d-%d", os.Getpid(), pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		testutil.SkipOrFail(t, "cgroup v1 freezer: %v", err)
	}
	state := filepath.Join(dir, "freezer.state")
	thaw = func() { _ = os.WriteFile(state, []byte("THAWED"), 0) }
	t.Cleanup(func() { thaw(); time.Sleep(50 * time.Millisecond); _ = os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "frozen", func() bool {
		b, _ := os.ReadFile(state)
		return strings.TrimSpace(string(b)) == "FROZEN"
	})
	return thaw
}

// TestWaitGivesUpOnAProcessThatDoesNotStop: a seized process that does not stop (here: kept
// frozen) makes Wait fail after StopTimeout instead of holding the tracer thread; once it
// can stop, it is let go and runs on, untraced.
func TestWaitGivesUpOnAProcessThatDoesNotStop(t *testing.T) {
	testutil.RequiresRoot(t)
	old := StopTimeout
	StopTimeout = 200 * time.Millisecond
	t.Cleanup(func() { StopTimeout = old })
	tr := NewTracer()
	r := startREPL(t)
	pid := r.cmd.Process.Pid
	thaw := freezeCgroup(t, pid)
	p, err := tr.Seize(pid, noCheck)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.Wait(); err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("Wait on a frozen process: %v after %s", err, time.Since(start))
	}
	thaw()
	testutil.WaitFor(t, 5*time.Second, 10*time.Millisecond, "the process let go", func() bool {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		return strings.Contains(string(status), "TracerPid:\t0")
	})
	if got := r.eval(t, "2+2"); got != "4" {
		t.Fatalf("the REPL after being let go: %s", got)
	}
}

// TestSpareCopy: Prefork makes a stopped copy ahead; the next Copy starts that
// very process (dumpable again, at the checkpoint's state); a spare the sandbox killed is
// replaced by a fresh fork; Release kills the spare with the template.
func TestSpareCopy(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	r := startREPL(t)
	r.eval(t, "x = 1")
	tp := checkpoint(t, tr, r.cmd.Process.Pid)
	if err := tp.Prefork(nil); err != nil {
		t.Fatal(err)
	}
	spare := tp.SparePid()
	if spare == 0 || spare == tp.Pid() {
		t.Fatalf("spare pid %d (template %d)", spare, tp.Pid())
	}
	if st := procState(spare); st != "t" {
		t.Fatalf("spare state %q, want t (traced stop)", st)
	}
	if err := tp.Prefork(nil); err != nil || tp.SparePid() != spare {
		t.Fatalf("second Prefork: %v, spare %d -> %d", err, spare, tp.SparePid())
	}
	r.eval(t, "x = 2")
	c := rollback(t, tp, r.cmd.Process.Pid)
	if c != spare || tp.SparePid() != 0 {
		t.Fatalf("copy %d, spare was %d, spare now %d", c, spare, tp.SparePid())
	}
	if got := r.eval(t, "x"); got != "1" {
		t.Fatalf("x = %s after a copy from the spare, want 1", got)
	}
	if d := r.eval(t, "__import__('ctypes').CDLL(None).prctl(3, 0, 0, 0, 0)"); d != "1" { // PR_GET_DUMPABLE
		t.Fatalf("copy dumpable %q, want 1", d)
	}
	// a spare killed from inside: the next copy forks anew
	if err := tp.Prefork(nil); err != nil {
		t.Fatal(err)
	}
	killed := tp.SparePid()
	if err := unix.Kill(killed, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "spare killed", func() bool { return procState(killed) == "Z" })
	r.eval(t, "x = 3")
	c = rollback(t, tp, c)
	if c == killed {
		t.Fatal("copy started from a killed spare")
	}
	if got := r.eval(t, "x"); got != "1" {
		t.Fatalf("x = %s after a copy past a killed spare, want 1", got)
	}
	if err := tp.Prefork(nil); err != nil {
		t.Fatal(err)
	}
	last := tp.SparePid()
	tp.Release()
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "spare gone with its template", func() bool {
		st := procState(last)
		return st == "Z" || st == "gone"
	})
}

// TestArmedCopyStartsWithTheThaw: a spare parked out of the frozen cgroup is armed while
// the process's cgroup is frozen (its calls run), moved into the frozen cgroup and started
// there: it stays frozen, runs at the thaw untraced, from the checkpoint's state (the
// original, killed while frozen, dies at the thaw).
func TestArmedCopyStartsWithTheThaw(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	r := startREPL(t)
	r.eval(t, "x = 1")
	pid := r.cmd.Process.Pid
	tp := checkpoint(t, tr, pid)
	park := filepath.Join("/sys/fs/cgroup/freezer", fmt.Sprintf("proctpl-park-%d", os.Getpid()))
	if err := os.Mkdir(park, 0o755); err != nil {
		testutil.SkipOrFail(t, "cgroup v1 freezer: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(park) })
	if err := tp.Prefork(func(p int) error {
		return os.WriteFile(filepath.Join(park, "cgroup.procs"), []byte(strconv.Itoa(p)), 0)
	}); err != nil {
		t.Fatal(err)
	}
	r.eval(t, "x = 2")
	thaw := freezeCgroup(t, pid)
	c, err := tp.Arm()
	if err != nil || c == 0 || c != tp.armed.pid {
		t.Fatalf("Arm = %d, %v", c, err)
	}
	dir := filepath.Join("/sys/fs/cgroup/freezer", fmt.Sprintf("proctpl-test-%d-%d", os.Getpid(), pid))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(c)), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := tp.Copy(); err != nil || got != c {
		t.Fatalf("Copy of the armed spare = %d, %v; want %d", got, err, c)
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	t.Cleanup(func() { _ = unix.Kill(c, unix.SIGKILL); var ws unix.WaitStatus; _, _ = unix.Wait4(c, &ws, 0, nil) })
	time.Sleep(10 * time.Millisecond)
	if st := procState(c); st != "D" {
		t.Fatalf("started copy in the frozen cgroup is %q, want frozen (D)", st)
	}
	thaw()
	if got := r.eval(t, "x"); got != "1" {
		t.Fatalf("x = %s in the copy started frozen, want 1", got)
	}
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", c))
	if !strings.Contains(string(status), "TracerPid:\t0") {
		t.Fatalf("the copy is still traced:\n%s", status)
	}
}

// TestKeep: Keep makes the template and resumes the process in one request (the process
// runs on, a rollback to the template brings back its state), and a failing before hook
// fails the template but still resumes the process, with no template process left.
func TestKeep(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	r := startREPL(t)
	r.eval(t, "x = 1")
	pid := r.cmd.Process.Pid
	p, err := tr.Seize(pid, noCheck)
	if err != nil {
		t.Fatal(err)
	}
	k, err := p.Keep(nil)
	if err != nil || k.ResumeErr != nil || k.Template == nil {
		t.Fatalf("Keep: %+v, %v", k, err)
	}
	t.Cleanup(k.Template.Release)
	if !(k.Stopped.After(time.Time{}) && !k.Templated.Before(k.Stopped) && !k.Resumed.Before(k.Templated)) {
		t.Errorf("Keep's times out of order: %+v", k)
	}
	if got := r.eval(t, "x"); got != "1" { // resumed
		t.Fatalf("x = %s after Keep, want 1", got)
	}
	r.eval(t, "x = 2")
	c := rollback(t, k.Template, pid)
	r.cmd.Process.Pid = c
	if got := r.eval(t, "x"); got != "1" {
		t.Fatalf("x = %s after a rollback to Keep's template, want 1", got)
	}

	var forked []int
	testHookForked = func(child int) { forked = append(forked, child) }
	defer func() { testHookForked = nil }()
	p, err = tr.Seize(c, noCheck)
	if err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused by the hook")
	k, err = p.Keep(func() error { return refused })
	if !errors.Is(err, refused) || k.Template != nil || k.ResumeErr != nil {
		t.Fatalf("Keep with a failing hook: %+v, %v; want the hook's error, no template, resumed", k, err)
	}
	if len(forked) != 0 {
		t.Errorf("Keep forked %v although its hook failed", forked)
	}
	if got := r.eval(t, "x"); got != "1" {
		t.Fatalf("x = %s after a failed Keep, want 1 (the process resumed)", got)
	}
}

// TestAliveWithoutTheTracerThread: a live template is told alive while its tracer thread is
// busy (no request to it: the rollback's frozen window asks for every template it copies),
// and one the sandbox SIGKILLed is told gone.
func TestAliveWithoutTheTracerThread(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	r := startREPL(t)
	p := stopped(t, tr, r.cmd.Process.Pid)
	tp, err := p.Template()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	defer tp.Release()
	busy, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = tr.do(func() error { close(busy); <-release; return nil })
	}()
	<-busy
	alive := make(chan bool, 1)
	go func() { alive <- tp.Alive() }()
	select {
	case a := <-alive:
		if !a {
			t.Fatal("a live template was told gone")
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("Alive waited for the busy tracer thread")
	}
	close(release)
	_ = unix.Kill(tp.Pid(), unix.SIGKILL) // the sandbox kills its own template
	testutil.WaitFor(t, 5*time.Second, 10*time.Millisecond, "the killed template to be told gone", func() bool { return !tp.Alive() })
}
