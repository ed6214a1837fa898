package initproto_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

// TestParkClosesListenerAndKeepsExecs: parked, the init has no socket (so a CRIU dump of it
// holds no path-bound unix socket) but keeps supervising the exec it already runs, whose
// output and exit arrive; unparked it answers again. Unpark is idempotent, and one sent while
// listening does not end the next park.
func TestParkClosesListenerAndKeepsExecs(t *testing.T) {
	p := startInit(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		st  initproto.ExitStatus
		err error
	}
	done := make(chan result, 1)
	var out testutil.SyncBuffer
	go func() {
		st, err := p.client.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.5; echo still-here"}}, nil, &out, nil)
		done <- result{st, err}
	}()
	time.Sleep(100 * time.Millisecond)                                   // the exec is running
	if err := p.cmd.Process.Signal(initproto.UnparkSignal); err != nil { // while listening: no-op
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := p.client.Park(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "parked init to remove its socket", func() bool {
		_, err := os.Lstat(p.socket)
		return os.IsNotExist(err)
	})
	time.Sleep(50 * time.Millisecond)
	if _, err := p.client.Ping(ctx); err == nil {
		t.Fatal("a parked init answered a ping")
	}
	r := <-done
	if r.err != nil || r.st.Code != 0 || out.String() != "still-here\n" {
		t.Fatalf("exec across the park: %+v %v %q", r.st, r.err, out.String())
	}
	for range 2 {
		if err := p.cmd.Process.Signal(initproto.UnparkSignal); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.client.WaitReady(ctx, time.Millisecond); err != nil {
		t.Fatalf("unparked init does not answer: %v", err)
	}
	if st, o, _ := p.run(t, initproto.ExecRequest{Argv: []string{"echo", "back"}}); st.Code != 0 || o != "back\n" {
		t.Fatalf("exec after unpark: %+v %q", st, o)
	}
}

// TestParkTimesOut: an init parked by a host that then died (no unpark) listens again by
// itself after its park timeout.
func TestParkTimesOut(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "init.sock")
	cmd := exec.Command(initBinary, "-socket", socket, "-park-timeout", "300ms")
	cmd.Stderr = logWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	c := initproto.New(socket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.WaitReady(ctx, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	parkedAt := time.Now()
	if err := c.Park(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "parked init to remove its socket", func() bool {
		_, err := os.Lstat(socket)
		return os.IsNotExist(err)
	})
	if _, err := c.WaitReady(ctx, 5*time.Millisecond); err != nil {
		t.Fatalf("init still parked after its timeout: %v", err)
	}
	if d := time.Since(parkedAt); d < 300*time.Millisecond {
		t.Fatalf("listening again after %s, before the 300ms park timeout", d)
	}
}
