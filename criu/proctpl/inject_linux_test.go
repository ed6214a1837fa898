package proctpl

import (
	"bytes"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// sigState is what the REPL says of its SIGTRAP: disposition, whether it is blocked, and how
// many times its handler (when it has one) ran.
const sigState = `(str(signal.getsignal(signal.SIGTRAP)).split(" at ")[0], signal.SIGTRAP in signal.pthread_sigmask(signal.SIG_BLOCK, []), traps[0])`

// TestInjectKeepsSignalState: a call is injected with one stop (single-step) into a process
// whose SIGTRAP is free, and with two (PTRACE_SYSCALL) into one that blocks or ignores it,
// where the single-step's forced trap would reset it; either way the original and its copy
// keep their SIGTRAP's disposition and mask, and a handler never runs for the tracer's traps.
func TestInjectKeepsSignalState(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	for _, c := range []struct {
		name, setup string
		want        stepMode
	}{
		{"default", "pass", stepTrap},
		{"handled", "signal.signal(signal.SIGTRAP, on_trap)", stepTrap},
		{"ignored", "signal.signal(signal.SIGTRAP, signal.SIG_IGN)", stepSyscall},
		{"blocked", "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTRAP])", stepSyscall},
	} {
		// Inspected: the step mode is read by Inspect in a frozen cgroup, as a checkpoint does.
		for _, inspected := range []bool{false, true} {
			name := c.name
			if inspected {
				name += "/inspected"
			}
			t.Run(name, func(t *testing.T) {
				r := trapREPL(t)
				r.eval(t, c.setup)
				before := r.eval(t, sigState)
				kernel := trapBits(t, r.cmd.Process.Pid)
				thaw := func() {}
				if inspected {
					thaw = freezeCgroup(t, r.cmd.Process.Pid)
				}
				p, err := tr.Seize(r.cmd.Process.Pid, noCheck)
				if err != nil {
					t.Fatal(err)
				}
				if inspected {
					p.Inspect()
					if p.task.step != c.want {
						t.Errorf("Inspect found step mode %d, want %d", p.task.step, c.want)
					}
					thaw()
				}
				tp := template(t, p)
				if p.task.step != c.want || tp.task.step != c.want {
					t.Errorf("injected with %d (template %d), want %d", p.task.step, tp.task.step, c.want)
				}
				if err := p.Resume(); err != nil {
					t.Fatal(err)
				}
				if got := r.eval(t, sigState); got != before {
					t.Fatalf("the original's SIGTRAP after its template: %s, want %s", got, before)
				}
				if got := trapBits(t, r.cmd.Process.Pid); got != kernel {
					t.Fatalf("the original's SIGTRAP in the kernel after its template: %s, want %s", got, kernel)
				}
				r.eval(t, "x = 1")
				c := rollback(t, tp, r.cmd.Process.Pid)
				if got := r.eval(t, sigState); got != before {
					t.Fatalf("the copy's SIGTRAP: %s, want %s", got, before)
				}
				if got := trapBits(t, c); got != kernel {
					t.Fatalf("the copy's SIGTRAP in the kernel: %s, want %s", got, kernel)
				}
				if got := r.eval(t, "'x' in globals()"); got != "False" {
					t.Fatalf("the copy has x: %s", got)
				}
			})
		}
	}
}

// trapREPL is a REPL with on_trap, a SIGTRAP handler counting in traps[0].
func trapREPL(t *testing.T) *repl {
	t.Helper()
	r := startREPL(t)
	r.eval(t, "import signal; traps = [0]")
	r.eval(t, "def on_trap(s, f): traps[0] += 1")
	return r
}

// stopped seizes pid and waits for it to stop for the tracer.
func stopped(t testing.TB, tr *Tracer, pid int) *Proc {
	t.Helper()
	p, err := tr.Seize(pid, noCheck)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return p
}

// trapBits is the kernel's view of pid's SIGTRAP (/proc/PID/stat): blocked, ignored, caught.
func trapBits(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	out := ""
	for _, i := range []int{29, 30, 31} { // blocked, sigignore, sigcatch
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out += strconv.FormatBool(v&trapSIGTRAP != 0) + " "
	}
	return out
}

// TestInjectTellsASentSIGTRAPFromItsTrap: a SIGTRAP sent to a process while it is seized is
// the process's (delivered once, after the resume), never taken for an injected call's
// trap, and the calls return their results.
func TestInjectTellsASentSIGTRAPFromItsTrap(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	r := trapREPL(t)
	r.eval(t, "signal.signal(signal.SIGTRAP, on_trap)")
	pid := r.cmd.Process.Pid
	p := stopped(t, tr, pid)
	if err := unix.Kill(pid, unix.SIGTRAP); err != nil {
		t.Fatal(err)
	}
	err := tr.do(func() error {
		for i := 0; i < 3; i++ {
			ret, _, err := p.task.inject(unix.SYS_GETPID)
			if err != nil {
				return err
			}
			if int(ret) != pid {
				t.Errorf("getpid in %d: %d", pid, ret)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.task.step != stepTrap || len(p.task.pending) != 1 || p.task.pending[0] != unix.SIGTRAP {
		t.Fatalf("step %d, pending %v: want single-step calls and the sent SIGTRAP kept", p.task.step, p.task.pending)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, 10*time.Millisecond, "the sent SIGTRAP's handler", func() bool {
		return r.eval(t, "traps[0]") != "0"
	})
	time.Sleep(20 * time.Millisecond)
	if got := r.eval(t, "traps[0]"); got != "1" {
		t.Fatalf("the handler ran %s times for one SIGTRAP sent", got)
	}
}

// BenchmarkInject measures one injected call (getpid) into a stopped python3, single-step
// and through PTRACE_SYSCALL.
func BenchmarkInject(b *testing.B) {
	testutil.RequiresRoot(b)
	tr := NewTracer()
	r := startREPL(b)
	pid := r.cmd.Process.Pid
	p := stopped(b, tr, pid)
	d := map[stepMode][]time.Duration{}
	err := tr.do(func() error { // alternated: the placement of the two on the CPUs moves in time
		for i := 0; i < b.N; i++ {
			for _, mode := range []stepMode{stepTrap, stepSyscall} {
				p.task.step = mode
				start := time.Now()
				ret, _, err := p.task.inject(unix.SYS_GETPID)
				if err != nil {
					return err
				}
				if int(ret) != pid {
					b.Fatalf("getpid %d, want %d", ret, pid)
				}
				d[mode] = append(d[mode], time.Since(start))
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for mode, name := range map[stepMode]string{stepTrap: "step", stepSyscall: "syscall"} {
		s := d[mode]
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		b.ReportMetric(float64(s[len(s)/2].Nanoseconds())/1000, name+"-p50-us")
		b.ReportMetric(float64(s[len(s)*99/100].Nanoseconds())/1000, name+"-p99-us")
	}
	if err := p.Resume(); err != nil {
		b.Fatal(err)
	}
	if got := r.eval(b, "1"); got != "1" {
		b.Fatalf("the REPL after the calls: %s", got)
	}
}
