//go:build linux

package initd

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/deltabox/deltabox/pool/initproto"
	"golang.org/x/sys/unix"
)

const pumpBuffer = 32 << 10

// handleExec runs one exec request to completion and writes its exit frame.
// session is one client connection: its buffered reader and serialized frame writer.
type session struct {
	conn *net.UnixConn
	br   *bufio.Reader
	fw   *initproto.FrameWriter
}

func (s *Server) handleExec(ctx context.Context, sess session, req *initproto.ExecRequest) {
	fw := sess.fw
	sp, err := s.prepare(req)
	if err != nil {
		replyStartError(fw, err)
		return
	}
	io, err := s.newPipes(req.Stdin)
	if err != nil {
		replyError(fw, initproto.CodeInternal, err)
		return
	}
	var d *detached
	if req.Detach != "" {
		if req.Stdin {
			err = errors.New("a detached exec takes no stdin")
		} else {
			d, err = s.reserveDetached(req.Detach)
		}
		if err != nil {
			io.close()
			replyError(fw, initproto.CodeInvalidArgument, err)
			return
		}
	}
	p, err := s.spawn(sp, req.Tag, io)
	if err != nil {
		io.close()
		s.dropDetached(d)
		replyStartError(fw, err)
		return
	}
	if req.ReportStart {
		_ = fw.WriteJSON(initproto.FrameStarted, initproto.Started{Pid: p.pid})
	}
	if d != nil {
		s.superviseDetached(ctx, sess, d, p, io, req)
		return
	}
	st := s.supervise(ctx, sess, p, io, req)
	_ = fw.Final(initproto.FrameExit, st)
}

// replyStartError answers a request that did not start: an exit frame for start failures,
// an error frame for invalid requests.
func replyStartError(fw *initproto.FrameWriter, err error) {
	var se *startError
	if errors.As(err, &se) {
		_ = fw.Final(initproto.FrameExit, initproto.ExitStatus{Code: se.code, Error: se.Error()})
		return
	}
	code := initproto.CodeInternal
	if errdefs.IsInvalidArgument(err) {
		code = initproto.CodeInvalidArgument
	}
	replyError(fw, code, err)
}

// supervise streams the output of p, feeds its stdin, enforces the timeout and client
// cancellation, and returns its exit status once it exited and its output drained.
func (s *Server) supervise(ctx context.Context, sess session, p *process, io *pipes, req *initproto.ExecRequest) initproto.ExitStatus {
	out := startPump(io.stdout, initproto.FrameStdout, sess.fw, req.OutputCap)
	errp := startPump(io.stderr, initproto.FrameStderr, sess.fw, req.OutputCap)
	cancelled := make(chan struct{})
	go readClient(sess, io.stdin, cancelled)
	ws, timedOut := waitExit(ctx, p, req.Timeout, cancelled)
	s.forget(p)
	if io.stdin != nil {
		io.stdin.Close()
	}
	s.drain(out, errp)
	st := statusOf(ws)
	st.TimedOut = timedOut
	st.Pid = p.pid
	st.Duration = time.Since(p.started)
	st.StdoutTruncated = out.truncated.Load()
	st.StderrTruncated = errp.truncated.Load()
	return st
}

// waitExit waits for p to exit, killing its process group on timeout, on client
// cancellation and on server shutdown.
func waitExit(ctx context.Context, p *process, timeout time.Duration, cancelled <-chan struct{}) (unix.WaitStatus, bool) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case ws := <-p.exit:
		return ws, false
	case <-expired:
		killGroup(p.pid)
		return <-p.exit, true
	case <-cancelled:
	case <-ctx.Done():
	}
	killGroup(p.pid)
	return <-p.exit, false
}

// readClient feeds stdin frames to the command and closes cancelled when the client goes
// away (or breaks the protocol), which kills the command.
func readClient(sess session, stdin *os.File, cancelled chan<- struct{}) {
	defer close(cancelled)
	var buf []byte
	for {
		t, payload, err := initproto.ReadFrame(sess.br, &buf)
		if err != nil {
			return
		}
		switch t {
		case initproto.FrameStdin:
			if stdin == nil {
				continue
			}
			if err := writeStdin(sess.conn, stdin, payload); errors.Is(err, errPeerGone) {
				return
			} else if err != nil {
				stdin = nil // the command closed its stdin: drop the rest
			}
		case initproto.FrameStdinEOF:
			if stdin != nil {
				stdin.Close()
				stdin = nil
			}
		default:
			return
		}
	}
}

var errPeerGone = errors.New("client closed the connection")

// writeStdin writes p to the command's stdin. A command that does not read its stdin
// blocks the write, and with it the reading of the connection, so the write wakes up
// regularly to check that the client is still there.
func writeStdin(conn *net.UnixConn, stdin *os.File, p []byte) error {
	for len(p) > 0 {
		_ = stdin.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := stdin.Write(p)
		p = p[n:]
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if peerClosed(conn) {
				return errPeerGone
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// peerClosed reports whether the client hung up, without reading from the connection.
func peerClosed(conn *net.UnixConn) bool {
	rc, err := conn.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		closed = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return closed
}

// busyDrainLimit bounds how long drain waits, past the grace, for pumps still forwarding
// output (a background process may write forever).
const busyDrainLimit = 2 * time.Second

// drain waits for the output pumps to reach EOF. Background processes may keep the pipes
// open long after the command exited, so once the drain grace has passed it stops waiting
// for pumps that sit idle in read. Pumps still forwarding output (to a slow client) get up
// to busyDrainLimit more, so a command's last output is not cut by a slow reader.
func (s *Server) drain(pumps ...*pump) {
	grace := time.Now().Add(s.drainGrace)
	limit := grace.Add(busyDrainLimit)
	for _, p := range pumps {
		for !p.wait(grace, limit) {
		}
	}
}

// wait waits a little for p to finish; it returns true when p is done or need not be
// waited for any longer.
func (p *pump) wait(grace, limit time.Time) bool {
	now := time.Now()
	if now.After(limit) || (now.After(grace) && !p.busy.Load() && !p.pending()) {
		return true
	}
	d := grace.Sub(now)
	if d <= 0 {
		d = 5 * time.Millisecond
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// pending reports whether the pipe holds output (or its end) not yet read. busy is false from
// just before a read until it returns, so a pump not scheduled since the command wrote its last
// output looks idle though that output waits in the pipe: on a loaded node it was cut (the
// exit frame went out first, the command "succeeded" with no output).
func (p *pump) pending() bool {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return false
	}
	ready := false
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		ready = err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0
	}); err != nil {
		return false // closed: the pump is done
	}
	return ready
}

func statusOf(ws unix.WaitStatus) initproto.ExitStatus {
	switch {
	case ws.Exited():
		return initproto.ExitStatus{Code: ws.ExitStatus()}
	case ws.Signaled():
		sig := ws.Signal()
		return initproto.ExitStatus{Code: 128 + int(sig), Signal: unix.SignalName(sig)}
	}
	return initproto.ExitStatus{Code: 255, Error: "unexpected wait status"}
}

// pump copies one output pipe into frames, keeping at most limit bytes (0: all) and
// draining the rest so the command never blocks on a full pipe.
type pump struct {
	f         *os.File // the pipe's read end (closed by run when done)
	done      chan struct{}
	truncated atomic.Bool
	busy      atomic.Bool // forwarding data (or about to read: see pending)
}

// frameSink takes an exec's output frames: the client's FrameWriter, or a detached exec's
// buffer (detached).
type frameSink interface {
	Write(t initproto.FrameType, payload []byte) error
}

func startPump(f *os.File, t initproto.FrameType, fw frameSink, limit int64) *pump {
	p := &pump{f: f, done: make(chan struct{})}
	go p.run(f, t, fw, limit)
	return p
}

func (p *pump) run(f *os.File, t initproto.FrameType, fw frameSink, limit int64) {
	defer close(p.done)
	defer f.Close()
	buf := make([]byte, pumpBuffer)
	left := limit
	for {
		p.busy.Store(false)
		n, err := f.Read(buf)
		p.busy.Store(true)
		chunk := buf[:n]
		if limit > 0 && int64(n) > left {
			chunk = chunk[:left]
			p.truncated.Store(true)
		}
		left -= int64(len(chunk))
		if len(chunk) > 0 {
			_ = fw.Write(t, chunk)
		}
		if err != nil {
			return
		}
	}
}
