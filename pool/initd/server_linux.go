//go:build linux

// Package initd is the server side of the sandbox init (cmd/deltabox-init): it reaps
// zombies as PID 1 (or as a child subreaper), listens on the init socket and serves the
// pool/initproto protocol: exec in its own process group with streamed output (on pipes, or
// on a pseudo-terminal of the sandbox's devpts), procs, kill and ping. It runs inside the sandbox, so it must stay dependency-light (x/sys and the
// protocol package only), must never wait for a child outside its reaper, and knows
// nothing about containerd or the host.
package initd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/deltabox/deltabox/pool/initproto"
	"golang.org/x/sys/unix"
)

// requestTimeout bounds how long a connection may take to send its request line.
const requestTimeout = 10 * time.Second

// Server serves the init protocol. Create it with New, then call Serve.
type Server struct {
	version     string
	etcDir      string
	procDir     string
	baseEnv     []string
	killTimeout time.Duration
	drainGrace  time.Duration
	log         *slog.Logger

	started   time.Time
	pid       int
	subreaper bool
	reaper    *reaper
	devNull   *os.File

	parkReq chan struct{}  // OpPark requests for the serve loop
	unpark  chan os.Signal // initproto.UnparkSignal (WithUnpark)
	parkMax time.Duration  // a parked listener reopens by itself after this (WithParkTimeout)

	handlers sync.WaitGroup

	resume *ResumeState // what the previous image of the init handed over (WithResume)

	mu       sync.Mutex
	execs    map[int]*process     // running execs by pid
	detached map[string]*detached // detached execs by key (see detach_linux.go)
}

// Option configures a Server.
type Option func(*Server)

// WithVersion sets the version string reported by ping.
func WithVersion(v string) Option { return func(s *Server) { s.version = v } }

// WithEtcDir sets where passwd and group are read for user lookups (default /etc).
func WithEtcDir(dir string) Option { return func(s *Server) { s.etcDir = dir } }

// WithBaseEnv sets the environment every exec starts from (default: the init's own).
func WithBaseEnv(env []string) Option { return func(s *Server) { s.baseEnv = env } }

// WithKillTimeout bounds how long kill waits for processes to vanish (default 5s).
func WithKillTimeout(d time.Duration) Option { return func(s *Server) { s.killTimeout = d } }

// WithDrainGrace sets how long an exec waits, after its command exited, for output still
// held open by background processes (default 100ms). Later output is dropped.
func WithDrainGrace(d time.Duration) Option { return func(s *Server) { s.drainGrace = d } }

// WithParkTimeout bounds how long the listener stays parked without an unpark signal
// (default 30s): a host that crashed between park and unpark does not leave the init deaf.
// The time a dump keeps the sandbox frozen counts too, so it only ends the park after the
// thaw, when the host unparks anyway.
func WithParkTimeout(d time.Duration) Option { return func(s *Server) { s.parkMax = d } }

// WithUnpark makes a parked Serve listen again when a signal arrives on sig (signal.Notify
// initproto.UnparkSignal there).
func WithUnpark(sig chan os.Signal) Option { return func(s *Server) { s.unpark = sig } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New returns a server. It does not touch the process until Serve.
func New(opts ...Option) *Server {
	s := &Server{
		version:     "dev",
		etcDir:      "/etc",
		procDir:     "/proc",
		baseEnv:     os.Environ(),
		killTimeout: 5 * time.Second,
		drainGrace:  100 * time.Millisecond,
		log:         slog.Default(),
		pid:         os.Getpid(),
		reaper:      newReaper(),
		execs:       make(map[int]*process),
		parkReq:     make(chan struct{}, 1),
		parkMax:     30 * time.Second,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Listen removes a stale socket at path and listens there with mode 0600.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	old := unix.Umask(0o177)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}

// Serve makes the process a child subreaper unless it is PID 1, starts the reaper and
// serves connections on l until ctx ends. A park request (initproto.OpPark) closes l; an
// unpark signal (WithUnpark) listens on the same path again. When ctx
// ends it closes the listener, kills every other process of the sandbox (see KillAll), lets
// the running execs send their exit frames and returns.
func (s *Server) Serve(ctx context.Context, l *net.UnixListener) error {
	if err := s.setup(); err != nil {
		return err
	}
	rctx, stopReaper := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReaper()
	s.adoptResumed(ctx)
	go s.reaper.run(rctx)
	err := s.serve(ctx, l)
	return errors.Join(err, s.shutdown())
}

// serve alternates between listening (accepting on l) and parked (no listener) until ctx
// ends.
func (s *Server) serve(ctx context.Context, l *net.UnixListener) error {
	path := l.Addr().String()
	for {
		if err := s.listening(ctx, l); err != nil || ctx.Err() != nil {
			return err
		}
		s.log.Info("listener parked", "socket", path)
		if l = s.parked(ctx, path); l == nil {
			return nil
		}
		s.log.Info("listener unparked", "socket", path)
	}
}

// listening accepts on l until ctx ends or a park request arrives, then closes l and returns
// once nothing uses it any more (nil), or returns the error that stopped accepting.
func (s *Server) listening(ctx context.Context, l *net.UnixListener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.accept(ctx, l) }()
	for {
		select {
		case err := <-errc: // only this loop closes l: accepting stopped by itself
			l.Close()
			if err == nil {
				err = errors.New("accept: listener closed")
			}
			return err
		case <-ctx.Done():
			l.Close()
			return <-errc
		case <-s.parkReq:
			l.Close()
			return <-errc
		case <-s.unpark: // already listening: drop it, or the next park would end at once
		}
	}
}

// parked waits for an unpark signal (or the park timeout) and listens again on path; it
// returns nil when ctx ends first. A failed listen is logged and leaves the init parked until
// the next unpark or timeout.
func (s *Server) parked(ctx context.Context, path string) *net.UnixListener {
	before, _ := startTime()
	for {
		timeout := time.NewTimer(s.parkMax)
		select {
		case <-ctx.Done():
			timeout.Stop()
			return nil
		case <-s.unpark:
		case <-timeout.C:
			s.log.Warn("listener parked too long without an unpark; listening again", "after", s.parkMax)
		}
		timeout.Stop()
		if now, err := startTime(); err == nil && before != 0 && now != before {
			// CRIU restored this process while it was parked (reexec_linux.go).
			err := s.reexec()
			s.log.Error("restored: execute the init again", "error", err)
			before = now
		}
		l, err := Listen(path)
		if err == nil {
			return l
		}
		s.log.Error("unpark: listen again", "error", err)
	}
}

// accept serves connections until l is closed (nil); the handlers run under ctx. It retries
// failed accepts (EMFILE and the like) after a pause.
func (s *Server) accept(ctx context.Context, l *net.UnixListener) error {
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Warn("accept failed", "error", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			s.handle(ctx, conn)
		}()
	}
}

// shutdown kills everything and waits (at most the kill timeout) for the handlers.
func (s *Server) shutdown() error {
	killed, err := s.KillAll(context.Background(), s.killTimeout)
	s.log.Info("shutting down", "killed", len(killed))
	done := make(chan struct{})
	go func() { s.handlers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.killTimeout):
		s.log.Warn("handlers still running at shutdown")
	}
	return err
}

func (s *Server) setup() error {
	s.started = time.Now()
	if s.pid != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set child subreaper: %w", err)
		}
		s.subreaper = true
	}
	f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	s.devNull = f
	return nil
}

// handle serves one connection: one request, one answer.
func (s *Server) handle(ctx context.Context, conn *net.UnixConn) {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	fw := initproto.NewFrameWriter(conn)
	_ = conn.SetReadDeadline(time.Now().Add(requestTimeout))
	req, err := initproto.ReadRequest(br)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		replyError(fw, initproto.CodeInvalidArgument, err)
		return
	}
	if req.Version != initproto.Version {
		replyError(fw, initproto.CodeFailedPrecondition,
			fmt.Errorf("protocol version %d not supported (init speaks %d)", req.Version, initproto.Version))
		return
	}
	switch req.Op {
	case initproto.OpPing:
		_ = fw.Final(initproto.FrameResult, s.ping())
	case initproto.OpProcs:
		_ = fw.Final(initproto.FrameResult, initproto.ProcsResponse{Procs: s.procs()})
	case initproto.OpKill:
		s.handleKill(ctx, fw, req.Kill)
	case initproto.OpPark:
		_ = fw.Final(initproto.FrameResult, struct{}{})
		select {
		case s.parkReq <- struct{}{}:
		default: // a park is already pending
		}
	case initproto.OpExec:
		if req.Exec != nil && req.Exec.TTY != nil {
			replyError(fw, initproto.CodeInvalidArgument, errors.New("exec with a terminal size: use op exec-tty"))
			return
		}
		s.handleExec(ctx, session{conn: conn, br: br, fw: fw}, req.Exec)
	case initproto.OpExecTTY:
		s.handleExecTTY(ctx, session{conn: conn, br: br, fw: fw}, req.Exec)
	case initproto.OpAttach:
		s.handleAttach(session{conn: conn, br: br, fw: fw}, req.Attach)
	default:
		replyError(fw, initproto.CodeInvalidArgument, fmt.Errorf("unknown op %q", req.Op))
	}
}

func replyError(fw *initproto.FrameWriter, code string, err error) {
	_ = fw.Final(initproto.FrameError, initproto.ErrorResponse{Code: code, Message: err.Error()})
}

func (s *Server) ping() initproto.PingResponse {
	return initproto.PingResponse{
		Protocol:  initproto.Version,
		Version:   s.version,
		Pid:       s.pid,
		Started:   s.started,
		Uptime:    time.Since(s.started),
		Subreaper: s.subreaper,
	}
}

func (s *Server) procs() []initproto.ProcInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]initproto.ProcInfo, 0, len(s.execs))
	for _, p := range s.execs {
		out = append(out, p.info())
	}
	return out
}

// killGroup sends SIGKILL to the process group led by pid.
func killGroup(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}
