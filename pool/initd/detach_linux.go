//go:build linux

package initd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/deltabox/deltabox/pool/initproto"
)

// Detached execs (ExecRequest.Detach): the command outlives its client. The host daemon runs
// `deltabox exec -d` this way so that a daemon restart (its connections close) does not kill
// the command: the restarted daemon follows it again with OpAttach, from the output offsets
// it already logged. While no client follows, the output goes to a window of the last
// DetachWindow bytes per stream (kept in the init's memory, which counts against the
// sandbox's own limit); what falls out of it before a client asks for it is lost, and the exit
// status says the stream was truncated.

// detached is one detached exec.
type detached struct {
	key string

	// what a re-execution of the init hands over while the command runs (reexec_linux.go)
	proc     *process
	pumps    [2]*pump
	cap      int64     // the exec's output cap (0: none)
	deadline time.Time // when its timeout kills it (zero: none)

	mu       sync.Mutex
	fw       *initproto.FrameWriter // the client following it, nil when none
	window   [2][]byte              // the last output of stdout and stderr (at least DetachWindow bytes)
	produced [2]int64               // bytes written to each stream so far
	lost     [2]bool                // a client asked for output the window no longer held
	exit     *initproto.ExitStatus  // set once the command exited and its output drained
	ended    time.Time
	done     chan struct{} // closed once exit is set (and sent to fw, if any)
}

// reserveDetached registers a new detached exec under key. The oldest exited ones are
// forgotten beyond MaxDetached; running ones are never dropped.
func (s *Server) reserveDetached(key string) (*detached, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.detached == nil {
		s.detached = map[string]*detached{}
	}
	if _, ok := s.detached[key]; ok {
		return nil, fmt.Errorf("a detached exec with key %q exists", key)
	}
	for len(s.detached) >= initproto.MaxDetached {
		var oldest *detached
		for _, d := range s.detached {
			d.mu.Lock()
			if d.exit != nil && (oldest == nil || d.ended.Before(oldest.ended)) {
				oldest = d
			}
			d.mu.Unlock()
		}
		if oldest == nil {
			return nil, fmt.Errorf("%d detached execs are running (at most %d)", len(s.detached), initproto.MaxDetached)
		}
		delete(s.detached, oldest.key)
	}
	d := &detached{key: key, done: make(chan struct{})}
	s.detached[key] = d
	return d, nil
}

// dropDetached forgets d (nil: nothing), e.g. when its command could not start.
func (s *Server) dropDetached(d *detached) {
	if d == nil {
		return
	}
	s.mu.Lock()
	if s.detached[d.key] == d {
		delete(s.detached, d.key)
	}
	s.mu.Unlock()
}

// forgetDetached drops every detached exec (a kill of all processes: the sandbox is reset).
// Supervisors still running finish with the client they have.
func (s *Server) forgetDetached() {
	s.mu.Lock()
	s.detached = nil
	s.mu.Unlock()
}

func (s *Server) lookupDetached(key string) *detached {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.detached[key]
}

func streamIndex(t initproto.FrameType) int {
	if t == initproto.FrameStderr {
		return 1
	}
	return 0
}

// Write keeps payload in the window of its stream and passes it on to the following client;
// a client that fails stops being followed (it went away).
func (d *detached) Write(t initproto.FrameType, payload []byte) error {
	i := streamIndex(t)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.produced[i] += int64(len(payload))
	w := append(d.window[i], payload...)
	if len(w) > 2*initproto.DetachWindow { // trim by copying, so the array does not grow
		w = append([]byte(nil), w[len(w)-initproto.DetachWindow:]...)
	}
	d.window[i] = w
	if d.fw != nil && d.fw.Write(t, payload) != nil {
		d.fw = nil
	}
	return nil
}

// superviseDetached runs a detached exec to its end: like supervise, but the client going
// away does not kill the command (a timeout or the init's shutdown still does).
func (s *Server) superviseDetached(ctx context.Context, sess session, d *detached, p *process, io *pipes, req *initproto.ExecRequest) {
	d.mu.Lock()
	d.fw = sess.fw
	d.proc, d.cap = p, req.OutputCap
	if req.Timeout > 0 {
		d.deadline = p.started.Add(req.Timeout)
	}
	out := startPump(io.stdout, initproto.FrameStdout, d, req.OutputCap)
	errp := startPump(io.stderr, initproto.FrameStderr, d, req.OutputCap)
	d.pumps = [2]*pump{out, errp}
	d.mu.Unlock()
	go d.follow(sess)
	s.finishDetached(ctx, d, p, req.Timeout)
}

// finishDetached waits for a detached exec's command to exit (killing it after timeout, if
// any), drains its output and records its status for the clients that follow it.
func (s *Server) finishDetached(ctx context.Context, d *detached, p *process, timeout time.Duration) {
	ws, timedOut := waitExit(ctx, p, timeout, nil)
	s.forget(p)
	d.mu.Lock()
	out, errp := d.pumps[0], d.pumps[1]
	d.mu.Unlock()
	s.drain(out, errp)
	st := statusOf(ws)
	st.TimedOut = timedOut
	st.Pid = p.pid
	st.Duration = time.Since(p.started)
	d.mu.Lock()
	defer d.mu.Unlock()
	st.StdoutTruncated = out.truncated.Load() || d.lost[0]
	st.StderrTruncated = errp.truncated.Load() || d.lost[1]
	d.exit, d.ended = &st, time.Now()
	if d.fw != nil && d.fw.Final(initproto.FrameExit, st) == nil {
		d.window = [2][]byte{} // delivered: only the status is kept for a late re-attach
	}
	d.fw = nil
	close(d.done)
}

// follow waits for the client of sess to go away (or break the protocol: a detached exec
// takes no stdin), stops sending it output and closes the connection at once: the init
// holds no connection from the host past its client (a park for a dump waits for them).
func (d *detached) follow(sess session) {
	gone := make(chan struct{})
	readClient(sess, nil, gone)
	d.mu.Lock()
	if d.fw == sess.fw {
		d.fw = nil
	}
	d.mu.Unlock()
	_ = sess.conn.Close()
}

// handleAttach serves OpAttach: the output of the detached exec from the client's offsets,
// then it follows the exec until its exit frame (or the client goes away).
func (s *Server) handleAttach(sess session, req *initproto.AttachRequest) {
	fw := sess.fw
	if req == nil || req.Key == "" || req.From[0] < 0 || req.From[1] < 0 {
		replyError(fw, initproto.CodeInvalidArgument, fmt.Errorf("attach: want a key and offsets >= 0"))
		return
	}
	d := s.lookupDetached(req.Key)
	if d == nil {
		replyError(fw, initproto.CodeNotFound, fmt.Errorf("no detached exec with key %q", req.Key))
		return
	}
	d.mu.Lock()
	for i, t := range []initproto.FrameType{initproto.FrameStdout, initproto.FrameStderr} {
		from, end := req.From[i], d.produced[i]
		base := end - int64(len(d.window[i]))
		if from < base {
			d.lost[i], from = true, base
		}
		for chunk := d.window[i][min(from, end)-base:]; len(chunk) > 0; {
			n := min(len(chunk), initproto.MaxDataFrame)
			_ = fw.Write(t, chunk[:n])
			chunk = chunk[n:]
		}
	}
	if d.exit != nil {
		st := *d.exit
		st.StdoutTruncated = st.StdoutTruncated || d.lost[0]
		st.StderrTruncated = st.StderrTruncated || d.lost[1]
		if fw.Final(initproto.FrameExit, st) == nil {
			d.window = [2][]byte{}
		}
		d.mu.Unlock()
		return
	}
	d.fw = fw // a previous client (a daemon that died) is not followed any more
	d.mu.Unlock()
	gone := make(chan struct{})
	go readClient(sess, nil, gone)
	select {
	case <-d.done:
	case <-gone:
		d.mu.Lock()
		if d.fw == fw {
			d.fw = nil
		}
		d.mu.Unlock()
	}
}
