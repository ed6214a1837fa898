package initproto_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

// background starts req and returns the first stdout line (a pid) and the exec's result.
func background(t *testing.T, p *initProc, req initproto.ExecRequest) (int, <-chan initproto.ExitStatus) {
	t.Helper()
	pr, pw := io.Pipe()
	res := make(chan initproto.ExitStatus, 1)
	go func() {
		st, err := p.client.Exec(context.Background(), req, nil, pw, nil)
		if err != nil {
			t.Errorf("exec %v: %v", req.Argv, err)
		}
		pw.Close()
		res <- st
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("exec %v: no pid line: %v", req.Argv, err)
	}
	go io.Copy(io.Discard, pr)
	return firstLinePid(t, line), res
}

func statusWithin(t *testing.T, res <-chan initproto.ExitStatus) initproto.ExitStatus {
	t.Helper()
	select {
	case st := <-res:
		return st
	case <-time.After(5 * time.Second):
		t.Fatal("exec did not end")
	}
	return initproto.ExitStatus{}
}

func TestKillByTag(t *testing.T) {
	p := startInit(t)
	// Tag a: a process group plus a setsid'd daemon that left it.
	daemon, resA := background(t, p, initproto.ExecRequest{
		Argv: []string{"sh", "-c", "setsid sleep 100 >/dev/null 2>&1 & echo $!; sleep 100"}, Tag: "a",
	})
	other, resB := background(t, p, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo $$; exec sleep 100"}, Tag: "b"})

	resp, err := p.client.Kill(context.Background(), initproto.KillRequest{Tag: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(resp.Killed, daemon) || slices.Contains(resp.Killed, other) {
		t.Fatalf("killed %v: want the daemon %d, not %d", resp.Killed, daemon, other)
	}
	if st := statusWithin(t, resA); st.Signal != "SIGKILL" {
		t.Fatalf("tag a exec: %+v, want SIGKILL", st)
	}
	waitGone(t, daemon)
	if !alive(other) {
		t.Fatalf("tag b process %d was killed", other)
	}
	procs, err := p.client.Procs(context.Background())
	if err != nil || len(procs) != 1 || procs[0].Tag != "b" {
		t.Fatalf("procs after kill a: %+v %v", procs, err)
	}
	p.client.Kill(context.Background(), initproto.KillRequest{Tag: "b"})
	if st := statusWithin(t, resB); st.Code != 137 {
		t.Fatalf("tag b exec: %+v", st)
	}
}

func TestKillAllCatchesEscapedDaemons(t *testing.T) {
	p := startInit(t)
	// A double-forked, setsid'd daemon with a scrubbed environment: only the pid-namespace
	// (here: descendant) walk can find it once the exec that started it is gone.
	st, out, _ := p.run(t, initproto.ExecRequest{
		Argv: []string{"sh", "-c", "(env -i setsid sleep 100 >/dev/null 2>&1 & echo $!)"},
		Tag:  "d",
	})
	if st.Code != 0 {
		t.Fatalf("status %+v", st)
	}
	daemon := firstLinePid(t, out)
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "the daemon to exec sleep", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", daemon))
		return string(b) == "sleep\n"
	})
	resp, err := p.client.Kill(context.Background(), initproto.KillRequest{Tag: "d"})
	if err != nil || len(resp.Killed) != 0 || !alive(daemon) {
		t.Fatalf("kill tag d with a scrubbed env should find nothing: %+v %v", resp, err)
	}
	resp, err = p.client.Kill(context.Background(), initproto.KillRequest{All: true})
	if err != nil || !slices.Contains(resp.Killed, daemon) {
		t.Fatalf("kill all: %+v %v, want %d", resp, err, daemon)
	}
	waitGone(t, daemon)
	if alive(p.cmd.Process.Pid) == false {
		t.Fatal("kill all killed the init")
	}
}

func TestKillRequiresSelector(t *testing.T) {
	p := startInit(t)
	if _, err := p.client.Kill(context.Background(), initproto.KillRequest{}); err == nil {
		t.Fatal("kill without tag or all succeeded")
	}
	if _, err := p.client.Kill(context.Background(), initproto.KillRequest{Tag: "x", All: true}); err == nil {
		t.Fatal("kill with tag and all succeeded")
	}
}

func TestSIGTERMKillsChildrenAndExits(t *testing.T) {
	p := startInit(t)
	pid, res := background(t, p, initproto.ExecRequest{Argv: []string{"sh", "-c", "setsid sleep 100 >/dev/null & echo $!; sleep 100"}})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("init exited with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("init did not exit")
	}
	if st := statusWithin(t, res); st.Signal != "SIGKILL" {
		t.Fatalf("running exec ended with %+v, want SIGKILL", st)
	}
	// The daemon was reparented to the init (a subreaper) and killed; once the init is gone
	// the test process (its new parent) may leave it a zombie, so only check it is not alive.
	testutil.WaitFor(t, 5*time.Second, 5*time.Millisecond, "daemon to die", func() bool { return !alive(pid) })
}

func TestUserSwitch(t *testing.T) {
	testutil.RequiresRoot(t)
	p := startInit(t)
	st, out, _ := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "id -u; id -g; id -G"}, User: "65534:65533"})
	if st.Code != 0 || out != "65534\n65533\n65533\n" {
		t.Fatalf("uid:gid: %+v %q", st, out)
	}
	st, out, _ = p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "id -un; echo $HOME"}, User: "nobody"})
	if st.Code != 0 || !strings.HasPrefix(out, "nobody\n") {
		t.Fatalf("nobody: %+v %q", st, out)
	}
	st, _, _ = p.run(t, initproto.ExecRequest{Argv: []string{"true"}, User: "no-such-user-deltabox"})
	if st.Code != 126 || !strings.Contains(st.Error, "not found") {
		t.Fatalf("unknown user: %+v", st)
	}
}
