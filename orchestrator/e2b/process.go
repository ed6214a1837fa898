package e2b

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
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
	mux.HandleFunc("POST /process.Process/Update", unary(g.updateProcess, g))
	mux.HandleFunc("POST /process.Process/StreamInput", func(w http.ResponseWriter, r *http.Request) {
		writeUnaryError(w, fmt.Errorf("StreamInput (client streaming) is not served; use SendInput: %w", errUnimplemented))
	})
	g.filesystemRoutes(mux)
	g.fileRoutes(mux)
}

// process is one command the gateway started, on pipes or on a terminal (pty).
type process struct {
	// pid is the command's pid in the sandbox (what ps shows, and $$ of a shell), as the
	// init reports it once the command runs. A command that could not be started, or whose
	// sandbox's init predates start reports and is slow to end, gets a handle above any pid
	// (syntheticPid) instead. Set once by register (under the sandbox's mu) before started
	// is closed.
	pid     uint32
	started chan struct{}
	seq     uint32 // the gateway's number for it (its tag)
	tag     string // the exec's DeltaBox tag (kill and signal by tag)
	userTag string // the tag the SDK gave, if any
	cfg     processConfig
	stdin   *io.PipeWriter // nil: stdin closed from the start (pipes)
	ctx     context.Context
	cancel  context.CancelFunc // kills the exec (its connection to the init closes)

	// tty carries a terminal's input (typed bytes, window sizes) to the exec; nil for a
	// command on pipes. ttyMu orders the senders; ttyEOF says Ctrl-D was typed by CloseStdin.
	tty    chan api.TTYInput
	ttyMu  sync.Mutex
	ttyEOF bool

	mu   sync.Mutex
	subs map[*subscriber]bool
	end  *endEvent
	done chan struct{}
}

// ctrlD is the terminal's usual EOF character (VEOF), typed by CloseStdin.
const ctrlD = 0x04

// syntheticPid is the base of the handles of processes without a pid: above pid_max's
// ceiling (1<<22), so they never name a real process of the sandbox.
const syntheticPid = 1 << 22

// startWait bounds how long a Start waits for the init's start report before it answers with
// a synthetic handle (an init that predates start reports sends none). The exec may first
// wait for the sandbox's first checkpoint.
var startWait = 20 * time.Second

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
	pty    bool // the terminal's output
}

func (o outWriter) Write(b []byte) (int, error) {
	data := append([]byte(nil), b...)
	ev := processEvent{Data: &dataEvent{Stdout: data}}
	switch {
	case o.pty:
		ev = processEvent{Data: &dataEvent{Pty: data}}
	case o.stderr:
		ev = processEvent{Data: &dataEvent{Stderr: data}}
	}
	o.p.publish(ev)
	return len(b), nil
}

func (g *Gateway) startProcess(ctx context.Context, sb *sandbox, req *startRequest, s *stream, ka time.Duration) error {
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

// spawn starts the command of req (on a terminal when req.Pty is set) and returns its
// process, once its pid is known, and the starting stream's subscriber, registered before the
// command runs so that no output is missed.
func (sb *sandbox) spawn(ctx context.Context, req *startRequest) (*process, *subscriber, error) {
	argv := sb.argv(ctx, req.Process)
	sb.mu.Lock()
	if sb.gone {
		sb.mu.Unlock()
		return nil, nil, fmt.Errorf("sandbox %q is gone: %w", sb.id, errdefs.ErrNotFound)
	}
	sb.seq++
	p := &process{seq: sb.seq, cfg: req.Process, subs: map[*subscriber]bool{}, done: make(chan struct{}), started: make(chan struct{})}
	sb.mu.Unlock()
	p.ctx, p.cancel = context.WithCancel(sb.ctx)
	p.tag = "e2b-" + strconv.FormatUint(uint64(p.seq), 10)
	if req.Tag != nil {
		p.userTag = *req.Tag
	}
	var stdin io.Reader
	if req.Stdin != nil && *req.Stdin && req.Pty == nil {
		pr, pw := io.Pipe()
		stdin, p.stdin = pr, pw
	}
	er := api.ExecRequest{Argv: argv, Env: envList(req.Process.Envs), Tag: p.tag, Workdir: sb.workdir}
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		er.Workdir = *req.Process.Cwd
	}
	er.User = basicUser(ctx)
	if req.Pty != nil {
		er.TTY = &api.TTYSize{}
		if sz := req.Pty.Size; sz != nil {
			er.TTY.Rows, er.TTY.Cols = clampDim(sz.Rows), clampDim(sz.Cols)
		}
		p.tty = make(chan api.TTYInput)
	}
	sub := p.subscribe()
	go sb.run(p, er, stdin)
	select {
	case <-p.started:
	case <-time.After(startWait):
		sb.register(p, 0)
	case <-ctx.Done():
		sb.register(p, 0) // the command goes on; Connect and List find it
		p.unsubscribe(sub)
		return nil, nil, ctx.Err()
	}
	return p, sub, nil
}

// clampDim makes a terminal dimension fit a window size field.
func clampDim(n uint32) uint16 { return uint16(min(n, 1<<16-1)) }

// register gives p its pid (a synthetic handle when pid is not positive) and makes it
// addressable, once: later calls do nothing. A process of the sandbox still registered under
// the same pid has ended (the pid was reused) and is replaced.
func (sb *sandbox) register(p *process, pid int) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if p.pid != 0 {
		return
	}
	if pid <= 0 || pid >= syntheticPid {
		pid = syntheticPid + int(p.seq)
	}
	p.pid = uint32(pid)
	sb.procs[p.pid] = p
	close(p.started)
}

// run executes the command and publishes its end.
func (sb *sandbox) run(p *process, er api.ExecRequest, stdin io.Reader) {
	defer p.cancel()
	started := func(pid int) { sb.register(p, pid) }
	var st api.ExitStatus
	var err error
	if p.tty != nil {
		st, err = sb.g.b.ExecTTY(p.ctx, sb.id, er, started, p.tty, outWriter{p: p, pty: true})
	} else {
		st, err = sb.g.b.ExecNotify(p.ctx, sb.id, er, started, stdin, outWriter{p: p}, outWriter{p: p, stderr: true})
	}
	sb.register(p, st.Pid) // not started, or no start report: the start event still needs a pid
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
	if sb.procs[p.pid] == p {
		delete(sb.procs, p.pid)
	}
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
// `/bin/bash -l -c CMD` and terminals as `/bin/bash -i -l`; a sandbox image without bash runs
// them with /bin/sh and the same options but -l (`/bin/sh -c CMD`, `/bin/sh -i`): a login
// shell of a minimal image (busybox) would read a profile written for bash, if any.
func (sb *sandbox) argv(ctx context.Context, c processConfig) []string {
	argv := append([]string{c.Cmd}, c.Args...)
	if c.Cmd != "/bin/bash" || sb.shellFor(ctx) == "/bin/bash" {
		return argv
	}
	return shArgv(c.Args)
}

// shArgv is the /bin/sh command line standing in for /bin/bash with args: the options before
// -c (or before the first operand) lose -l and --login; the rest is kept as it is.
func shArgv(args []string) []string {
	out := []string{"/bin/sh"}
	for i, a := range args {
		if a == "-c" || a == "--" || !strings.HasPrefix(a, "-") {
			return append(out, args[i:]...)
		}
		if a != "-l" && a != "--login" {
			out = append(out, a)
		}
	}
	return out
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
	if p.tty != nil { // a terminal: what is typed on it (the SDK sends pty bytes)
		data := req.Input.Pty
		if len(data) == 0 {
			data = req.Input.Stdin
		}
		if len(data) == 0 {
			return &empty{}, nil
		}
		return &empty{}, p.typeInput(ctx, api.TTYInput{Stdin: data}, false)
	}
	if len(req.Input.Pty) > 0 {
		return nil, fmt.Errorf("process %d has no terminal (start it with pty): %w", p.pid, errdefs.ErrFailedPrecondition)
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

// typeInput hands in to the process's terminal, in the order the calls came; last says it is
// the last input the terminal takes (CloseStdin's Ctrl-D).
func (p *process) typeInput(ctx context.Context, in api.TTYInput, last bool) error {
	p.ttyMu.Lock()
	defer p.ttyMu.Unlock()
	if p.ttyEOF {
		return fmt.Errorf("the terminal of process %d was closed (CloseStdin): %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	select {
	case p.tty <- in:
		p.ttyEOF = last
		return nil
	case <-p.done:
		return fmt.Errorf("process %d ended: %w", p.pid, errdefs.ErrNotFound)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// updateProcess resizes a process's terminal (the SDK's pty.resize); the terminal's
// foreground process group gets SIGWINCH.
func (g *Gateway) updateProcess(ctx context.Context, sb *sandbox, req *updateRequest) (*empty, error) {
	p, err := sb.process(req.Process)
	if err != nil {
		return nil, err
	}
	if p.tty == nil {
		return nil, fmt.Errorf("process %d has no terminal to resize (start it with pty): %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	if req.Pty == nil || req.Pty.Size == nil || req.Pty.Size.Rows == 0 || req.Pty.Size.Cols == 0 {
		return nil, fmt.Errorf("update: pty.size needs rows and cols: %w", errdefs.ErrInvalidArgument)
	}
	size := api.TTYSize{Rows: clampDim(req.Pty.Size.Rows), Cols: clampDim(req.Pty.Size.Cols)}
	return &empty{}, p.typeInput(ctx, api.TTYInput{Resize: &size}, false)
}

// closeStdin closes a command's stdin; on a terminal it types Ctrl-D, as a user ending the
// input would: the end of input for a program reading lines in canonical mode, and for a
// line editor (an interactive shell's, which reads in raw mode) on an empty line; the
// terminal then takes no more input. (The init's own EOF, FrameStdinEOF, types nothing in raw
// mode, so the input channel is not closed for it.)
func (g *Gateway) closeStdin(ctx context.Context, sb *sandbox, req *closeStdinRequest) (*empty, error) {
	p, err := sb.process(req.Process)
	if err != nil {
		return nil, err
	}
	if p.tty != nil {
		p.ttyMu.Lock()
		eof := p.ttyEOF
		p.ttyMu.Unlock()
		if eof {
			return &empty{}, nil
		}
		return &empty{}, p.typeInput(ctx, api.TTYInput{Stdin: []byte{ctrlD}}, true)
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
	return &empty{}, nil
}

// sendSignal signals the process: SIGKILL kills it and its descendants, SIGTERM is sent once
// to them (a command that traps it can clean up and exit as it likes).
func (g *Gateway) sendSignal(ctx context.Context, sb *sandbox, req *sendSignalRequest) (*empty, error) {
	p, err := sb.process(req.Process)
	if err != nil {
		return nil, err
	}
	switch req.Signal {
	case "SIGNAL_SIGKILL", float64(9):
	case "SIGNAL_SIGTERM", float64(15):
		if _, err := g.b.SignalTag(ctx, sb.id, p.tag, "SIGTERM"); err != nil && !errdefs.IsNotFound(err) {
			return nil, err
		}
		return &empty{}, nil
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
