package initproto_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/deltabox/deltabox/pool/initproto"
)

func TestSymlinkedSocketIsRefused(t *testing.T) {
	dir := t.TempDir()
	// A "host" socket the sandbox would like the host to talk to.
	hostSock := filepath.Join(dir, "host.sock")
	l, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	runDir := filepath.Join(dir, "run")
	os.Mkdir(runDir, 0o755)
	link := filepath.Join(runDir, "init.sock")
	if err := os.Symlink(hostSock, link); err != nil {
		t.Fatal(err)
	}
	_, err = initproto.New(link).Ping(context.Background())
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("ping through a symlink: %v, want permission denied", err)
	}
	_, err = initproto.New(link).Exec(context.Background(), initproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("exec through a symlink: %v, want permission denied", err)
	}
	select {
	case <-accepted:
		t.Fatal("the client connected to the symlink's target")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestNonSocketIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "init.sock")
	os.WriteFile(path, nil, 0o600)
	if _, err := initproto.New(path).Ping(context.Background()); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("ping of a regular file: %v, want permission denied", err)
	}
	if _, err := initproto.New(path + ".missing").Ping(context.Background()); !errdefs.IsUnavailable(err) {
		t.Fatalf("ping of a missing socket: %v, want unavailable", err)
	}
}

// fakeInit serves every connection with answer after reading the request line.
func fakeInit(t *testing.T, answer func(net.Conn)) *initproto.Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "init.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				bufio.NewReader(c).ReadString('\n')
				answer(c)
			}()
		}
	}()
	return initproto.New(path)
}

func header(t initproto.FrameType, n uint32) []byte {
	h := []byte{byte(t), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[1:], n)
	return h
}

func TestHostileInitCannotExhaustMemory(t *testing.T) {
	huge := fakeInit(t, func(c net.Conn) { c.Write(header(initproto.FrameStdout, 1<<31)) })
	_, err := huge.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"x"}}, nil, nil, nil)
	if !errors.Is(err, initproto.ErrProtocol) {
		t.Fatalf("2 GiB frame: %v, want a protocol error", err)
	}
	_, err = huge.Ping(context.Background())
	if !errors.Is(err, initproto.ErrProtocol) {
		t.Fatalf("ping with a huge frame: %v, want a protocol error", err)
	}
	unknown := fakeInit(t, func(c net.Conn) { c.Write(header(99, 1)) })
	if _, err := unknown.Ping(context.Background()); !errors.Is(err, initproto.ErrProtocol) {
		t.Fatalf("unknown frame: %v, want a protocol error", err)
	}
	badJSON := fakeInit(t, func(c net.Conn) { initproto.WriteFrame(c, initproto.FrameResult, []byte("{not json")) })
	if _, err := badJSON.Ping(context.Background()); !errors.Is(err, initproto.ErrProtocol) {
		t.Fatalf("bad JSON: %v, want a protocol error", err)
	}
}

func TestClientEnforcesOutputCap(t *testing.T) {
	chunk := make([]byte, initproto.MaxDataFrame)
	flood := fakeInit(t, func(c net.Conn) {
		for range 8 {
			if initproto.WriteFrame(c, initproto.FrameStdout, chunk) != nil {
				return
			}
		}
		initproto.WriteJSONFrame(c, initproto.FrameExit, initproto.ExitStatus{})
	})
	var out strings.Builder
	st, err := flood.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"x"}, OutputCap: 100}, nil, &out, nil)
	if err != nil || out.Len() != 100 || !st.StdoutTruncated {
		t.Fatalf("got %d bytes, %+v, %v: want 100 and truncated", out.Len(), st, err)
	}
}

func TestSilentInitHonoursContext(t *testing.T) {
	silent := fakeInit(t, func(c net.Conn) { time.Sleep(5 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := silent.Ping(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("ping of a silent init: %v after %s", err, time.Since(start))
	}
}

func TestServerRejectsOtherVersions(t *testing.T) {
	p := startInit(t)
	c, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte(`{"v":99,"op":"ping"}` + "\n"))
	var buf []byte
	typ, payload, err := initproto.ReadFrame(c, &buf)
	if err != nil || typ != initproto.FrameError || !strings.Contains(string(payload), initproto.CodeFailedPrecondition) {
		t.Fatalf("got frame %d %q %v, want a failed_precondition error", typ, payload, err)
	}
}

func TestSocketMode(t *testing.T) {
	p := startInit(t)
	fi, err := os.Lstat(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", fi.Mode())
	}
}

func TestHostileMessagesAreClipped(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	c := fakeInit(t, func(c net.Conn) {
		initproto.WriteJSONFrame(c, initproto.FrameExit, initproto.ExitStatus{Code: 127, Error: long})
	})
	st, err := c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"x"}}, nil, nil, nil)
	if err != nil || len(st.Error) > 5000 || st.Code != 127 {
		t.Fatalf("got error of %d bytes, %v", len(st.Error), err)
	}
	e := fakeInit(t, func(c net.Conn) {
		initproto.WriteJSONFrame(c, initproto.FrameError, initproto.ErrorResponse{Code: "internal", Message: long})
	})
	if _, err := e.Ping(context.Background()); err == nil || len(err.Error()) > 5000 {
		t.Fatalf("error frame: %d bytes", len(fmt.Sprint(err)))
	}
}

func TestDialChecksProtocol(t *testing.T) {
	p := startInit(t)
	if _, err := initproto.Dial(context.Background(), p.socket); err != nil {
		t.Fatalf("dial: %v", err)
	}
	old := fakeInit(t, func(c net.Conn) {
		initproto.WriteJSONFrame(c, initproto.FrameResult, initproto.PingResponse{Protocol: initproto.Version + 1})
	})
	if _, err := initproto.Dial(context.Background(), old.Path()); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("dial of another protocol version: %v", err)
	}
}

// TestRelayIsRefusedByPeerCheck: a sandbox process replaced the init's socket with its own
// listener (a relay). A client that checks the peer refuses it before sending a byte, so the
// request (argv, env, secrets) never reaches the relay.
func TestRelayIsRefusedByPeerCheck(t *testing.T) {
	p := startInit(t)
	os.Remove(p.socket)
	relay, err := net.Listen("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	got := make(chan string, 4)
	go func() {
		for {
			c, err := relay.Accept()
			if err != nil {
				return
			}
			if line, _ := bufio.NewReader(c).ReadString('\n'); line != "" {
				got <- line
			}
			c.Close()
		}
	}()
	initPid := int32(p.cmd.Process.Pid)
	check := func(pid int32, uid, gid uint32) error {
		if pid != initPid {
			return fmt.Errorf("served by pid %d, not the init (pid %d): %w", pid, initPid, errdefs.ErrPermissionDenied)
		}
		return nil
	}
	c := initproto.New(p.socket, initproto.WithPeerCheck(check))
	_, err = c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"true"}, Env: []string{"SECRET=s3cr3t"}}, nil, nil, nil)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "not the init") {
		t.Fatalf("exec through a relay: %v, want permission denied naming the peer", err)
	}
	if _, err := c.Ping(context.Background()); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("ping through a relay: %v, want permission denied", err)
	}
	select {
	case line := <-got:
		t.Fatalf("the relay received %q", line)
	case <-time.After(50 * time.Millisecond):
	}
	// The unchecked client is what the relay attack used: it does reach the relay.
	go initproto.New(p.socket).Ping(context.Background())
	if line := <-got; !strings.Contains(line, "ping") {
		t.Fatalf("relay test is broken: an unchecked ping sent %q", line)
	}
}
