package e2b

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// envdRoutes registers the in-sandbox services.
func (g *Gateway) envdRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /process.Process/Start", serverStream(g.startProcess, g))
	mux.HandleFunc("POST /process.Process/Connect", serverStream(g.connectProcess, g))
	mux.HandleFunc("POST /process.Process/List", unary(g.listProcesses, g))
	mux.HandleFunc("POST /process.Process/SendInput", unary(g.sendInput, g))
	mux.HandleFunc("POST /process.Process/CloseStdin", unary(g.closeStdin, g))
	mux.HandleFunc("POST /process.Process/SendSignal", unary(g.sendSignal, g))
	mux.HandleFunc("POST /process.Process/Update", unary(func(ctx context.Context, sb *sandbox, req *updateRequest) (*empty, error) {
		return nil, fmt.Errorf("PTY resize: DeltaBox sandboxes have no PTY: %w", errUnimplemented)
	}, g))
	mux.HandleFunc("POST /process.Process/StreamInput", func(w http.ResponseWriter, r *http.Request) {
		writeUnaryError(w, fmt.Errorf("StreamInput (client streaming) is not served; use SendInput: %w", errUnimplemented))
	})
	g.filesystemRoutes(mux)
	g.fileRoutes(mux)
}

// process is one command the gateway started. pid is the gateway's handle for it (the SDK
// uses it only to address the process), not its pid inside the sandbox.
type process struct {
	pid     uint32
	tag     string // the exec's DeltaBox tag (kill by tag)
	userTag string // the tag the SDK gave, if any
	cfg     processConfig
	stdin   *io.PipeWriter // nil: stdin closed from the start
	ctx     context.Context
	cancel  context.CancelFunc // kills the exec (its connection to the init closes)

	mu   sync.Mutex
	subs map[*subscriber]bool
	end  *endEvent
	done chan struct{}
}

// subscriber is one stream (Start or Connect) following a process's events.
type subscriber struct {
	ch   chan processEvent
	gone chan struct{}
}

// publish hands ev to every subscriber; a slow one holds the process's output back (like a
// full pipe), a gone one is skipped.
func (p *process) publish(ev processEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (p *process) subscribe() *subscriber {
	s := &subscriber{ch: make(chan processEvent, 64), gone: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = true
	p.mu.Unlock()
	return s
}

func (p *process) unsubscribe(s *subscriber) {
	close(s.gone)
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// outWriter turns a stream of the command into data events.
type outWriter struct {
	p      *process
	stderr bool
}

func (o outWriter) Write(b []byte) (int, error) {
	data := append([]byte(nil), b...)
	ev := processEvent{Data: &dataEvent{Stdout: data}}
	if o.stderr {
		ev = processEvent{Data: &dataEvent{Stderr: data}}
	}
	o.p.publish(ev)
	return len(b), nil
}

func (g *Gateway) startProcess(ctx context.Context, sb *sandbox, req *startRequest, s *stream, ka time.Duration) error {
	if req.Pty != nil {
		return fmt.Errorf("PTY: DeltaBox's sandbox init runs commands with pipes, not a terminal: %w", errUnimplemented)
	}
	if req.Process.Cmd == "" {
		return fmt.Errorf("process.cmd is empty: %w", errdefs.ErrInvalidArgument)
	}
	if sb.perCommand {
		if _, err := g.b.Checkpoint(ctx, sb.id, api.CheckpointRequest{Message: "e2b command"}); err != nil {
			return fmt.Errorf("checkpoint before the command: %w", err)
		}
	}
	p, sub, err := sb.spawn(ctx, req)
	if err != nil {
		return err
	}
	return follow(ctx, p, sub, s, ka)
}

// spawn starts the command of req and returns its process and the starting stream's
// subscriber, registered before the command runs so that no output is missed.
func (sb *sandbox) spawn(ctx context.Context, req *startRequest) (*process, *subscriber, error) {
	argv := sb.argv(ctx, req.Process)
	sb.mu.Lock()
	if sb.gone {
		sb.mu.Unlock()
		return nil, nil, fmt.Errorf("sandbox %q is gone: %w", sb.id, errdefs.ErrNotFound)
	}
	sb.nextPid++
	p := &process{pid: sb.nextPid, cfg: req.Process, subs: map[*subscriber]bool{}, done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(sb.ctx)
	p.tag = "e2b-" + strconv.FormatUint(uint64(p.pid), 10)
	if req.Tag != nil {
		p.userTag = *req.Tag
	}
	sb.procs[p.pid] = p
	sb.mu.Unlock()
	var stdin io.Reader
	if req.Stdin != nil && *req.Stdin {
		pr, pw := io.Pipe()
		stdin, p.stdin = pr, pw
	}
	er := api.ExecRequest{Argv: argv, Env: envList(req.Process.Envs), Tag: p.tag, Workdir: sb.workdir}
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		er.Workdir = *req.Process.Cwd
	}
	er.User = basicUser(ctx)
	sub := p.subscribe()
	go sb.run(p, er, stdin)
	return p, sub, nil
}

// run executes the command and publishes its end.
func (sb *sandbox) run(p *process, er api.ExecRequest, stdin io.Reader) {
	defer p.cancel()
	st, err := sb.g.b.Exec(p.ctx, sb.id, er, stdin, outWriter{p: p}, outWriter{p: p, stderr: true})
	end := &endEvent{ExitCode: int32(st.Code), Exited: true, Status: "exit status " + strconv.Itoa(st.Code)}
	switch {
	case err != nil && p.ctx.Err() != nil && sb.ctx.Err() == nil: // killed through the API
		end = &endEvent{ExitCode: 137, Exited: true, Status: "signal: killed"}
		err = nil
	case err != nil:
		msg := err.Error()
		end = &endEvent{ExitCode: -1, Status: "error", Error: &msg}
	case st.Error != "":
		msg := st.Error
		end.Error = &msg
	case st.Signal != "":
		end.Status = "signal: " + st.Signal
	}
	if p.stdin != nil {
		p.stdin.CloseWithError(io.ErrClosedPipe)
	}
	p.mu.Lock()
	p.end = end
	p.mu.Unlock()
	p.publish(processEvent{End: end})
	close(p.done)
	sb.mu.Lock()
	delete(sb.procs, p.pid)
	sb.mu.Unlock()
	if err != nil {
		log.L(sb.ctx).Warn("e2b command failed", "sandbox", sb.id, "error", err)
	}
}

// follow streams a process's events to s: the start event first, then its output, until its
// end (or the client leaves, which leaves the process running).
func follow(ctx context.Context, p *process, sub *subscriber, s *stream, ka time.Duration) error {
	defer p.unsubscribe(sub)
	if err := s.send(processEventMsg{Event: processEvent{Start: &startEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	tick := time.NewTicker(ka)
	defer tick.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if err := s.send(processEventMsg{Event: ev}); err != nil {
				return err
			}
			if ev.End != nil {
				return nil
			}
		case <-p.done:
			// Drain what was published before the end, then stop.
			for {
				select {
				case ev := <-sub.ch:
					if err := s.send(processEventMsg{Event: ev}); err != nil || ev.End != nil {
						return err
					}
				default:
					p.mu.Lock()
					end := p.end
					p.mu.Unlock()
					return s.send(processEventMsg{Event: processEvent{End: end}})
				}
			}
		case <-tick.C:
			if err := s.send(processEventMsg{Event: processEvent{Keepalive: &empty{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// argv turns a process config into a command line. The SDK runs commands as
// `/bin/bash -l -c CMD`; a sandbox image without bash runs them with `/bin/sh -c CMD`.
func (sb *sandbox) argv(ctx context.Context, c processConfig) []string {
	argv := append([]string{c.Cmd}, c.Args...)
	if c.Cmd != "/bin/bash" || sb.shellFor(ctx) == "/bin/bash" {
		return argv
	}
	args := c.Args
	if len(args) > 0 && args[0] == "-l" {
		args = args[1:]
	}
	return append([]string{"/bin/sh"}, args...)
}

// shellFor finds out once whether the sandbox has /bin/bash.
func (sb *sandbox) shellFor(ctx context.Context) string {
	sb.mu.Lock()
	sh := sb.shell
	sb.mu.Unlock()
	if sh != "" {
		return sh
	}
	sh = "/bin/sh"
	if root, err := sb.g.b.SandboxRoot(ctx, sb.id); err == nil {
		if _, err := root.Lstat("bin/bash"); err == nil {
			sh = "/bin/bash"
		} else if _, err := root.Lstat("usr/bin/bash"); err == nil {
			sh = "/bin/bash"
		}
		root.Close()
	}
	sb.mu.Lock()
	sb.shell = sh
	sb.mu.Unlock()
	return sh
}

func (sb *sandbox) process(sel processSelector) (*process, error) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sel.Pid != nil {
		if p := sb.procs[*sel.Pid]; p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("process %d not found: %w", *sel.Pid, errdefs.ErrNotFound)
	}
	if sel.Tag != nil {
		for _, p := range sb.procs {
			if p.userTag != "" && p.userTag == *sel.Tag {
				return p, nil
			}
		}
		return nil, fmt.Errorf("process tagged %q not found: %w", *sel.Tag, errdefs.ErrNotFound)
	}
	return nil, fmt.Errorf("process selector needs a pid or a tag: %w", errdefs.ErrInvalidArgument)
}

func (g *Gateway) connectProcess(ctx context.Context, sb *sandbox, req *connectProcessRequest, s *stream, ka time.Duration) error {
	p, err := sb.process(req.Process)
	if err != nil {
		return err
	}
	return follow(ctx, p, p.subscribe(), s, ka)
}

func (g *Gateway) listProcesses(ctx context.Context, sb *sandbox, _ *empty) (*listResponse, error) {
	sb.mu.Lock()
	out := listResponse{Processes: []processInfo{}}
	for _, p := range sb.procs {
		info := processInfo{Config: p.cfg, Pid: p.pid}
		if p.userTag != "" {
			info.Tag = &p.userTag
		}
		out.Processes = append(out.Processes, info)
	}
	sb.mu.Unlock()
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return &out, nil
}

func (g *Gateway) sendInput(ctx context.Context, sb *sandbox, req *sendInputRequest) (*empty, error) {
	p, err := sb.process(req.Process)
	if err != nil {
		return nil, err
	}
	if len(req.Input.Pty) > 0 {
		return nil, fmt.Errorf("PTY input: DeltaBox sandboxes have no PTY: %w", errUnimplemented)
	}
	if p.stdin == nil {
		return nil, fmt.Errorf("process %d was started without stdin (pass stdin: true): %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	done := make(chan error, 1)
	go func() { _, err := p.stdin.Write(req.Input.Stdin); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("stdin of process %d: %v: %w", p.pid, err, errdefs.ErrFailedPrecondition)
		}
		return &empty{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (g *Gateway) closeStdin(ctx context.Context, sb *sandbox, req *closeStdinRequest) (*empty, error) {
	p, err := sb.process(req.Process)
	if err != nil {
		return nil, err
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
	return &empty{}, nil
}

// sendSignal kills the process (SIGKILL or SIGTERM: the init kills with SIGKILL either way).
func (g *Gateway) sendSignal(ctx context.Context, sb *sandbox, req *sendSignalRequest) (*empty, error) {
	p, err := sb.process(req.Process)
	if err != nil {
		return nil, err
	}
	switch req.Signal {
	case "SIGNAL_SIGKILL", "SIGNAL_SIGTERM", float64(9), float64(15):
	default:
		return nil, fmt.Errorf("signal %v: want SIGKILL or SIGTERM: %w", req.Signal, errdefs.ErrInvalidArgument)
	}
	// Closing the exec's connection makes the init SIGKILL its process group (also when the
	// command has not started yet); the kill by tag then gets descendants that left the group.
	p.cancel()
	if _, err := g.b.KillTag(ctx, sb.id, p.tag); err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	return &empty{}, nil
}

// basicUser is the user an in-sandbox request names (Authorization: Basic base64(user:)).
type userKey struct{}

func basicUser(ctx context.Context) string {
	u, _ := ctx.Value(userKey{}).(string)
	return u
}
