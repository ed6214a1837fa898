package initproto_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/pool/initproto"
)

// TestDetachedExecOutlivesItsClient: a detached exec keeps running when its client goes away
// (a daemon killed with SIGKILL), and OpAttach follows it again from the client's offsets,
// to its exit status.
func TestDetachedExecOutlivesItsClient(t *testing.T) {
	p := startInit(t)
	dir := t.TempDir()
	gate := dir + "/go"
	script := "echo one; echo err1 >&2; while [ ! -e " + gate + " ]; do sleep 0.01; done; echo two; echo err2 >&2; exit 7"
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncWriter{w: &bytes.Buffer{}}
	started := make(chan int, 1)
	res := make(chan error, 1)
	go func() {
		_, err := p.client.ExecNotify(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", script}, Detach: "k1"},
			func(pid int) { started <- pid }, nil, out, nil)
		res <- err
	}()
	pid := <-started
	waitFor(t, func() bool { return strings.Contains(out.String(), "one") })
	cancel() // the client goes away: the command must survive
	if err := <-res; err == nil {
		t.Fatal("a cancelled exec returned no error")
	}
	time.Sleep(50 * time.Millisecond)
	if !alive(pid) {
		t.Fatalf("detached exec %d died with its client", pid)
	}
	if _, err := p.client.ExecNotify(context.Background(), initproto.ExecRequest{Argv: []string{"true"}, Detach: "k1"}, nil, nil, nil, nil); err == nil {
		t.Fatal("a second detached exec with the same key was accepted")
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Re-attach from what the first client had of stdout ("one\n") and nothing of stderr.
	var out2, err2 bytes.Buffer
	st, err := p.client.Attach(context.Background(), "k1", [2]int64{4, 0}, &out2, &err2)
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 7 || st.Pid != pid || out2.String() != "two\n" || err2.String() != "err1\nerr2\n" {
		t.Fatalf("attach: %+v stdout %q stderr %q", st, out2.String(), err2.String())
	}
	if st.StdoutTruncated || st.StderrTruncated {
		t.Fatalf("attach: nothing was lost, got %+v", st)
	}
	// An exited detached exec still answers (its status) until a kill of everything.
	if st, err := p.client.Attach(context.Background(), "k1", [2]int64{8, 10}, nil, nil); err != nil || st.Code != 7 {
		t.Fatalf("attach after the end: %+v %v", st, err)
	}
	if _, err := p.client.Kill(context.Background(), initproto.KillRequest{All: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Attach(context.Background(), "k1", [2]int64{}, nil, nil); !errdefs.IsNotFound(err) {
		t.Fatalf("attach after kill all: %v, want not found", err)
	}
	if _, err := p.client.ExecNotify(context.Background(), initproto.ExecRequest{Argv: []string{"cat"}, Detach: "k2"}, nil, strings.NewReader("x"), nil, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("detached exec with stdin: %v, want invalid argument", err)
	}
}

// TestDetachedExecLosesOnlyBeyondTheWindow: output written while nobody follows beyond
// DetachWindow is lost, and the exit status says so.
func TestDetachedExecLosesOnlyBeyondTheWindow(t *testing.T) {
	p := startInit(t)
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan int, 1)
	go p.client.ExecNotify(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.1; head -c " + strconv.Itoa(3*initproto.DetachWindow) + " /dev/zero"}, Detach: "big"},
		func(pid int) { started <- pid }, nil, nil, nil)
	pid := <-started
	cancel()
	waitGone(t, pid) // it wrote everything while nobody followed
	var out bytes.Buffer
	st, err := p.client.Attach(context.Background(), "big", [2]int64{}, &out, nil)
	if err != nil || st.Code != 0 || !st.StdoutTruncated || out.Len() < initproto.DetachWindow || out.Len() >= 3*initproto.DetachWindow {
		t.Fatalf("attach: %+v %v, %d bytes", st, err, out.Len())
	}
}

// TestKillWithSIGTERM: a kill with Signal SIGTERM lets a command that traps it clean up.
func TestKillWithSIGTERM(t *testing.T) {
	p := startInit(t)
	out := &syncWriter{w: &bytes.Buffer{}}
	res := make(chan initproto.ExitStatus, 1)
	go func() {
		st, _ := p.client.Exec(context.Background(), initproto.ExecRequest{
			Argv: []string{"sh", "-c", "trap 'echo cleaned; exit 3' TERM; echo ready; while :; do sleep 0.01; done"}, Tag: "t"}, nil, out, nil)
		res <- st
	}()
	waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
	if _, err := p.client.Kill(context.Background(), initproto.KillRequest{Tag: "t", Signal: "SIGTERM"}); err != nil {
		t.Fatal(err)
	}
	if st := statusWithin(t, res); st.Code != 3 || !strings.Contains(out.String(), "cleaned") {
		t.Fatalf("after SIGTERM: %+v, output %q", st, out.String())
	}
	if _, err := p.client.Kill(context.Background(), initproto.KillRequest{Tag: "t", Signal: "SIGSTOP"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("kill with SIGSTOP: %v, want invalid argument", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal(errors.New("condition not met within 5s"))
}

// syncWriter is a writer safe to read from another goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}
