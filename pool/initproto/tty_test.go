package initproto_test

import (
	"bufio"
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/deltabox/deltabox/pool/initproto"
)

// screen collects a terminal's output and lets a test wait for a pattern in it.
type screen struct {
	mu      sync.Mutex
	buf     strings.Builder
	changed chan struct{}
}

func newScreen() *screen { return &screen{changed: make(chan struct{}, 1)} }

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.buf.Write(p)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the output matches re and returns the first submatch (or the match).
func (s *screen) waitFor(t *testing.T, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(10 * time.Second)
	for {
		if m := rx.FindStringSubmatch(s.String()); m != nil {
			return m[len(m)-1]
		}
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("terminal output %q never matched %q", s.String(), re)
		}
	}
}

// ttyExec runs req on a terminal in the background; the test feeds input and reads the
// screen, then collects the status from the returned channel.
func ttyExec(t *testing.T, p *initProc, req initproto.ExecRequest) (chan<- initproto.TTYInput, *screen, <-chan initproto.ExitStatus) {
	t.Helper()
	in := make(chan initproto.TTYInput)
	scr := newScreen()
	res := make(chan initproto.ExitStatus, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	go func() {
		st, err := p.client.ExecTTY(ctx, req, in, scr)
		if err != nil {
			t.Errorf("exec-tty %v: %v", req.Argv, err)
		}
		res <- st
	}()
	return in, scr, res
}

func send(t *testing.T, in chan<- initproto.TTYInput, v initproto.TTYInput) {
	t.Helper()
	select {
	case in <- v:
	case <-time.After(10 * time.Second):
		t.Fatal("terminal input not taken")
	}
}

func waitStatus(t *testing.T, res <-chan initproto.ExitStatus) initproto.ExitStatus {
	t.Helper()
	select {
	case st := <-res:
		return st
	case <-time.After(20 * time.Second):
		t.Fatal("terminal exec did not end")
	}
	return initproto.ExitStatus{}
}

func TestExecTTYIsATerminal(t *testing.T) {
	p := startInit(t)
	var out strings.Builder
	st, err := p.client.ExecTTY(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", "tty; exit 3"}}, nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 3 || !regexp.MustCompile(`^/dev/pts/[0-9]+\r\n$`).MatchString(out.String()) {
		t.Fatalf("tty: status %+v output %q, want code 3 and a /dev/pts path (CRLF: the terminal maps newlines)", st, out.String())
	}
	// stdout and stderr are the same terminal
	out.Reset()
	st, err = p.client.ExecTTY(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", "echo err >&2; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all"}}, nil, &out)
	if err != nil || st.Code != 0 || out.String() != "err\r\nall\r\n" {
		t.Fatalf("stdio on the terminal: %+v %v output %q", st, err, out.String())
	}
}

// TestExecTTYReportsStart: with a started callback the pid comes before any output and is
// the pid the command sees ($$).
func TestExecTTYReportsStart(t *testing.T) {
	p := startInit(t)
	var out strings.Builder
	pid := 0
	st, err := p.client.ExecTTYNotify(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", "echo pid=$$"}},
		func(n int) {
			if out.Len() != 0 {
				t.Errorf("started after output %q", out.String())
			}
			pid = n
		}, nil, &out)
	if err != nil || st.Code != 0 {
		t.Fatalf("exec-tty: %+v %v", st, err)
	}
	if pid <= 0 || out.String() != "pid="+strconv.Itoa(pid)+"\r\n" || st.Pid != pid {
		t.Fatalf("started pid %d, status pid %d, output %q", pid, st.Pid, out.String())
	}
}

func TestExecTTYResize(t *testing.T) {
	p := startInit(t)
	in, scr, res := ttyExec(t, p, initproto.ExecRequest{
		Argv: []string{"sh", "-c", `trap 'echo winch' WINCH; echo "size $(stty size)"; read x; echo "size $(stty size)"; exit 7`},
		TTY:  &initproto.WinSize{Rows: 30, Cols: 100},
	})
	scr.waitFor(t, `size 30 100`)
	send(t, in, initproto.TTYInput{Size: &initproto.WinSize{Rows: 50, Cols: 132}, Data: []byte("go\r")})
	scr.waitFor(t, `size 50 132`)
	if st := waitStatus(t, res); st.Code != 7 {
		t.Fatalf("status %+v, want code 7; screen %q", st, scr.String())
	}
	if !strings.Contains(scr.String(), "winch") {
		t.Errorf("the shell got no SIGWINCH: %q", scr.String())
	}
}

func TestExecTTYCtrlCInterrupts(t *testing.T) {
	p := startInit(t)
	in, scr, res := ttyExec(t, p, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo ready; exec sleep 100"}})
	scr.waitFor(t, "ready")
	start := time.Now()
	send(t, in, initproto.TTYInput{Data: []byte{0x03}})
	st := waitStatus(t, res)
	if st.Code != 130 || st.Signal != "SIGINT" || time.Since(start) > 5*time.Second {
		t.Fatalf("after ^C: status %+v after %v, want SIGINT (130)", st, time.Since(start))
	}
}

func TestExecTTYCtrlDEndsInput(t *testing.T) {
	p := startInit(t)
	in, scr, res := ttyExec(t, p, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo ready; cat; echo done"}})
	scr.waitFor(t, "ready")
	send(t, in, initproto.TTYInput{Data: []byte("hello\r")})
	scr.waitFor(t, `hello\r\nhello\r\n`) // the terminal's echo, then cat's copy
	send(t, in, initproto.TTYInput{Data: []byte{0x04}})
	scr.waitFor(t, "done")
	if st := waitStatus(t, res); st.Code != 0 {
		t.Fatalf("status %+v", st)
	}
	// closing the input types the EOF character too
	in, scr, res = ttyExec(t, p, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo ready; cat; echo done"}})
	scr.waitFor(t, "ready")
	close(in)
	if st := waitStatus(t, res); st.Code != 0 || !strings.Contains(scr.String(), "done") {
		t.Fatalf("after closing the input: status %+v screen %q", st, scr.String())
	}
}

func TestExecTTYTimeoutAndCancel(t *testing.T) {
	p := startInit(t)
	start := time.Now()
	st, err := p.client.ExecTTY(context.Background(), initproto.ExecRequest{Argv: []string{"sleep", "100"}, Timeout: 200 * time.Millisecond}, nil, nil)
	if err != nil || !st.TimedOut || st.Code != 137 || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout: %+v %v after %v", st, err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	scr := newScreen()
	done := make(chan error, 1)
	go func() {
		_, err := p.client.ExecTTY(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo $$; exec sleep 100"}}, nil, scr)
		done <- err
	}()
	pid := firstLinePid(t, scr.waitFor(t, `(?s)^(\d+\r\n)`))
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled exec-tty returned no error")
	}
	waitGone(t, pid)
}

func TestExecTTYUser(t *testing.T) {
	p := startInit(t)
	var out strings.Builder
	st, err := p.client.ExecTTY(context.Background(), initproto.ExecRequest{
		Argv: []string{"sh", "-c", "id -u; stat -c %u $(tty)"}, User: "65534:65534"}, nil, &out)
	if err != nil || st.Code != 0 || out.String() != "65534\r\n65534\r\n" {
		t.Fatalf("as 65534: %+v %v output %q, want the terminal owned by the user", st, err, out.String())
	}
}

func TestExecTTYProtocolErrors(t *testing.T) {
	p := startInit(t)
	// op exec with a terminal size is refused: a terminal needs exec-tty
	conn, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	line, _ := initproto.EncodeRequest(initproto.Request{Op: initproto.OpExec, Exec: &initproto.ExecRequest{Argv: []string{"true"}, TTY: &initproto.WinSize{}}})
	conn.Write(line)
	var buf []byte
	if ft, _, err := initproto.ReadFrame(bufio.NewReader(conn), &buf); err != nil || ft != initproto.FrameError {
		t.Fatalf("exec with tty: frame %d %v, want an error frame", ft, err)
	}
	// a malformed resize frame (3 bytes) ends the exec: the command is killed
	conn2, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	line, _ = initproto.EncodeRequest(initproto.Request{Op: initproto.OpExecTTY, Exec: &initproto.ExecRequest{Argv: []string{"sleep", "100"}, TTY: &initproto.WinSize{}}})
	conn2.Write(line)
	conn2.Write([]byte{byte(initproto.FrameResize), 0, 0, 0, 3, 1, 2, 3})
	conn2.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn2)
	for {
		ft, payload, err := initproto.ReadFrame(r, &buf)
		if err != nil {
			t.Fatalf("no exit frame after a bad resize frame: %v", err)
		}
		if ft == initproto.FrameExit {
			var st initproto.ExitStatus
			initproto.DecodeJSON(payload, &st)
			if st.Signal != "SIGKILL" {
				t.Fatalf("after a bad resize frame: %+v, want the command killed", st)
			}
			break
		}
	}
	// an init without terminal support answers "unknown op": a clear failed precondition
	old := fakeInit(t, func(c net.Conn) {
		initproto.WriteJSONFrame(c, initproto.FrameError, initproto.ErrorResponse{Code: initproto.CodeInvalidArgument, Message: `unknown op "exec-tty"`})
	})
	if _, err := old.ExecTTY(context.Background(), initproto.ExecRequest{Argv: []string{"true"}}, nil, nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("exec-tty against an old init: %v, want failed precondition", err)
	}
}
