package initproto_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

func TestPing(t *testing.T) {
	p := startInit(t)
	resp, err := p.client.Ping(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Protocol != initproto.Version || resp.Pid != p.cmd.Process.Pid || !resp.Subreaper {
		t.Fatalf("ping = %+v, want protocol %d pid %d subreaper", resp, initproto.Version, p.cmd.Process.Pid)
	}
	if resp.Uptime <= 0 || resp.Version == "" {
		t.Fatalf("ping = %+v: want uptime and version", resp)
	}
}

func TestExecExitCodes(t *testing.T) {
	p := startInit(t)
	for _, tc := range []struct {
		argv []string
		code int
	}{
		{[]string{"true"}, 0},
		{[]string{"false"}, 1},
		{[]string{"sh", "-c", "exit 42"}, 42},
	} {
		st, _, _ := p.run(t, initproto.ExecRequest{Argv: tc.argv})
		if st.Code != tc.code || !st.Started() || st.Pid == 0 {
			t.Errorf("%v: status %+v, want code %d", tc.argv, st, tc.code)
		}
	}
}

func TestExecOutput(t *testing.T) {
	p := startInit(t)
	st, out, errOut := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo hello; echo oops >&2"}})
	if st.Code != 0 || out != "hello\n" || errOut != "oops\n" {
		t.Fatalf("got %+v stdout %q stderr %q", st, out, errOut)
	}
}

func TestExecEnvMergesOverBase(t *testing.T) {
	p := startInit(t, "BASE_ONLY=base", "OVERRIDE=base")
	st, out, _ := p.run(t, initproto.ExecRequest{
		Argv: []string{"sh", "-c", `echo "$BASE_ONLY $OVERRIDE $NEW $DELTABOX_TAG"`},
		Env:  []string{"OVERRIDE=req", "NEW=new"},
		Tag:  "step-1",
	})
	if st.Code != 0 || out != "base req new step-1\n" {
		t.Fatalf("got %+v %q", st, out)
	}
}

func TestExecInvalidEnvIsRejected(t *testing.T) {
	p := startInit(t)
	_, err := p.client.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "KEY=VALUE") {
		t.Fatalf("want invalid env error, got %v", err)
	}
}

func TestExecWorkdir(t *testing.T) {
	p := startInit(t)
	dir := t.TempDir()
	st, out, _ := p.run(t, initproto.ExecRequest{Argv: []string{"pwd"}, Workdir: dir})
	if st.Code != 0 || out != dir+"\n" {
		t.Fatalf("got %+v %q, want %q", st, out, dir)
	}
	st, _, _ = p.run(t, initproto.ExecRequest{Argv: []string{"pwd"}, Workdir: dir + "/missing"})
	if st.Code != 126 || !strings.Contains(st.Error, "workdir") {
		t.Fatalf("missing workdir: got %+v", st)
	}
}

func TestExecStdin(t *testing.T) {
	p := startInit(t)
	in := make([]byte, 3<<20)
	rand.Read(in)
	var out bytes.Buffer
	st, err := p.client.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(in), &out, nil)
	if err != nil || st.Code != 0 {
		t.Fatalf("cat: %+v %v", st, err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Fatalf("cat returned %d bytes, want the %d sent", out.Len(), len(in))
	}
}

func TestExecNoStdinIsDevNull(t *testing.T) {
	p := startInit(t)
	st, out, _ := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "cat; echo done"}})
	if st.Code != 0 || out != "done\n" {
		t.Fatalf("got %+v %q", st, out)
	}
}

func TestExecOutputCap(t *testing.T) {
	p := startInit(t)
	st, out, errOut := p.run(t, initproto.ExecRequest{
		Argv:      []string{"sh", "-c", "head -c 5000000 /dev/zero; echo small >&2"},
		OutputCap: 1000,
	})
	if st.Code != 0 {
		t.Fatalf("capped output must not break the command: %+v", st)
	}
	if len(out) != 1000 || !st.StdoutTruncated {
		t.Fatalf("stdout: %d bytes truncated=%v, want 1000 and true", len(out), st.StdoutTruncated)
	}
	if errOut != "small\n" || st.StderrTruncated {
		t.Fatalf("stderr %q truncated=%v, want it whole", errOut, st.StderrTruncated)
	}
}

func TestExecBigOutputUncapped(t *testing.T) {
	p := startInit(t)
	st, out, _ := p.run(t, initproto.ExecRequest{Argv: []string{"head", "-c", "10000000", "/dev/zero"}})
	if st.Code != 0 || len(out) != 10000000 || st.StdoutTruncated {
		t.Fatalf("got %+v with %d bytes", st, len(out))
	}
}

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	p := startInit(t)
	start := time.Now()
	st, out, _ := p.run(t, initproto.ExecRequest{
		Argv:    []string{"sh", "-c", "sleep 100 & echo $!; sleep 100"},
		Timeout: 300 * time.Millisecond,
	})
	if !st.TimedOut || st.Signal != "SIGKILL" || st.Code != 137 {
		t.Fatalf("status %+v, want timed out by SIGKILL", st)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %s", d)
	}
	waitGone(t, firstLinePid(t, out))
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	p := startInit(t)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := p.client.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & echo $!; sleep 100"}}, nil, pw, nil)
		done <- err
	}()
	line := make([]byte, 32)
	n, _ := pr.Read(line)
	pid := firstLinePid(t, string(line[:n]))
	go io.Copy(io.Discard, pr)
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("cancelled exec returned %v", err)
	}
	waitGone(t, pid)
	testutil.WaitFor(t, 5*time.Second, 5*time.Millisecond, "exec to leave procs", func() bool {
		procs, err := p.client.Procs(context.Background())
		return err == nil && len(procs) == 0
	})
}

func TestExecConcurrent(t *testing.T) {
	p := startInit(t)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Go(func() {
			var out bytes.Buffer
			st, err := p.client.Exec(context.Background(), initproto.ExecRequest{
				Argv: []string{"sh", "-c", fmt.Sprintf("echo %d; exit %d", i, i%7)},
			}, nil, &out, nil)
			if err != nil || st.Code != i%7 || out.String() != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("exec %d: %+v %q %v", i, st, out.String(), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestExecMissingBinary(t *testing.T) {
	p := startInit(t)
	for _, name := range []string{"no-such-binary-deltabox", "/nonexistent/bin/tool"} {
		st, _, _ := p.run(t, initproto.ExecRequest{Argv: []string{name}})
		if st.Code != 127 || st.Started() || !strings.Contains(st.Error, name) {
			t.Errorf("%s: status %+v, want 127 with an error naming it", name, st)
		}
	}
	dir := t.TempDir()
	os.WriteFile(dir+"/noexec", []byte("#!/bin/sh\n"), 0o644)
	st, _, _ := p.run(t, initproto.ExecRequest{Argv: []string{dir + "/noexec"}})
	if st.Code != 126 || !strings.Contains(st.Error, "permission denied") {
		t.Errorf("non-executable: status %+v, want 126", st)
	}
}

func TestZombiesAreReaped(t *testing.T) {
	p := startInit(t)
	// The shell exits at once; its background sleep is orphaned to the init (a subreaper
	// here, PID 1 in a sandbox) and must be reaped when it exits.
	st, out, _ := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.2 >/dev/null & echo $!"}})
	if st.Code != 0 {
		t.Fatalf("status %+v", st)
	}
	pid := firstLinePid(t, out)
	waitGone(t, pid)
}

func TestProcsListsRunningExecs(t *testing.T) {
	p := startInit(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.client.Exec(ctx, initproto.ExecRequest{Argv: []string{"sleep", "100"}, Tag: "t1"}, nil, nil, nil)
	var procs []initproto.ProcInfo
	testutil.WaitFor(t, 5*time.Second, 2*time.Millisecond, "the exec in procs", func() bool {
		var err error
		procs, err = p.client.Procs(context.Background())
		return err == nil && len(procs) == 1
	})
	got := procs[0]
	if got.Tag != "t1" || got.Pid != got.Pgid || got.Argv[0] != "sleep" || time.Since(got.Started) > time.Minute {
		t.Fatalf("procs = %+v", procs)
	}
}

func TestExecReturnsWhileBackgroundHoldsOutput(t *testing.T) {
	p := startInit(t)
	start := time.Now()
	st, out, _ := p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & echo hi"}})
	if st.Code != 0 || out != "hi\n" {
		t.Fatalf("got %+v %q", st, out)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("exec waited %s for a background process holding stdout", d)
	}
	// A background process writing forever must not hold the exec either.
	start = time.Now()
	st, _, _ = p.run(t, initproto.ExecRequest{Argv: []string{"sh", "-c", "yes & echo started"}, OutputCap: 1 << 20})
	if st.Code != 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("exec with a chatty background process: %+v after %s", st, time.Since(start))
	}
	if _, err := p.client.Kill(context.Background(), initproto.KillRequest{All: true}); err != nil {
		t.Fatal(err)
	}
}

// slowWriter is a client-side sink that reads slowly.
type slowWriter struct{ n int }

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(10 * time.Millisecond)
	w.n += len(p)
	return len(p), nil
}

func TestExecSlowClientGetsAllOutput(t *testing.T) {
	p := startInit(t)
	var w slowWriter
	st, err := p.client.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"head", "-c", "600000", "/dev/zero"}}, nil, &w, nil)
	if err != nil || st.Code != 0 || w.n != 600000 {
		t.Fatalf("slow client got %d of 600000 bytes: %+v %v", w.n, st, err)
	}
}

// endless is a stdin that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) { return len(p), nil }

func TestExecCancelWhileStdinBlocked(t *testing.T) {
	p := startInit(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// sleep never reads stdin: the init's stdin write blocks, yet the cancel must be seen.
	_, err := p.client.Exec(ctx, initproto.ExecRequest{Argv: []string{"sleep", "100"}}, endless{}, nil, nil)
	if err == nil {
		t.Fatal("exec with a cancelled context succeeded")
	}
	testutil.WaitFor(t, 5*time.Second, 5*time.Millisecond, "the exec to be killed", func() bool {
		procs, err := p.client.Procs(context.Background())
		return err == nil && len(procs) == 0
	})
}
