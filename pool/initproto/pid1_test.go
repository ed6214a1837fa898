package initproto_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

// startPID1 runs the init as PID 1 of a new pid namespace with its own /proc, as in a
// sandbox (without the container around it). As PID 1 the init stops only on SIGKILL.
func startPID1(t *testing.T) *initProc {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "unshare")
	return startWrapped(t, []string{"unshare", "--pid", "--kill-child=SIGKILL", "--mount-proc"})
}

// existsInside reports whether /proc/pid exists in the init's pid namespace.
func existsInside(t *testing.T, p *initProc, pid int) bool {
	st, _, _ := p.run(t, initproto.ExecRequest{Argv: []string{"test", "-e", fmt.Sprintf("/proc/%d", pid)}})
	return st.Code == 0
}

func TestAsPID1(t *testing.T) {
	p := startPID1(t)
	ping, err := p.client.Ping(context.Background())
	if err != nil || ping.Pid != 1 || ping.Subreaper {
		t.Fatalf("ping = %+v %v, want pid 1 without subreaper", ping, err)
	}
	// Orphans are reparented to PID 1 and must be reaped.
	st, out, _ := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.1 >/dev/null & echo $!"}})
	orphan := firstLinePid(t, out)
	if st.Code != 0 || orphan <= 1 {
		t.Fatalf("orphan exec: %+v %q", st, out)
	}
	testutil.WaitFor(t, 5*time.Second, 10*time.Millisecond, "orphan to be reaped by PID 1", func() bool {
		return !existsInside(t, p, orphan)
	})
	// Kill-all walks the whole pid namespace: a double-forked daemon with a scrubbed env.
	_, out, _ = p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "(env -i setsid sleep 100 >/dev/null 2>&1 & echo $!)"}})
	daemon := firstLinePid(t, out)
	resp, err := p.client.Kill(context.Background(), initproto.KillRequest{All: true})
	if err != nil || !slices.Contains(resp.Killed, daemon) || slices.Contains(resp.Killed, 1) {
		t.Fatalf("kill all: %+v %v, want %d and not 1", resp, err, daemon)
	}
	if existsInside(t, p, daemon) {
		t.Fatalf("daemon %d survived kill all", daemon)
	}
}

// TestPID1DropsSignalsFromInside: a sandbox process signals its init with everything a shell
// can send; the init neither exits nor dumps core (Go's own handlers exit on TERM, HUP, INT
// and dump on QUIT, ABRT), and keeps serving.
func TestPID1DropsSignalsFromInside(t *testing.T) {
	p := startPID1(t)
	for _, sig := range []string{"TERM", "QUIT", "HUP", "INT", "ABRT", "USR1", "USR2", "PIPE", "ALRM", "TSTP", "SYS", "SEGV", "KILL", "STOP"} {
		st, _, errOut := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "kill -" + sig + " 1 && sleep 0.05"}})
		if st.Code != 0 {
			t.Fatalf("kill -%s 1: %+v %s", sig, st, errOut)
		}
		ping, err := p.client.Ping(context.Background())
		if err != nil || ping.Pid != 1 {
			t.Fatalf("init after kill -%s 1: %+v %v", sig, ping, err)
		}
	}
	// Execs still get the default dispositions (handlers are reset on exec, SIG_IGN is not).
	st, _, _ := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 10 & kill -TERM $!; wait $!"}})
	if st.Code != 128+15 {
		t.Fatalf("a child of the init ignores SIGTERM: %+v", st)
	}
}
