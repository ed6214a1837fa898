package orchestrator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/initproto"
)

// Detached execs (`deltabox exec -d`): the daemon runs the command as a detached exec of the
// sandbox's init (initproto.ExecRequest.Detach: it is not killed when the daemon's connection
// closes), writes its output to a log of ExecEvent lines in the lease's directory
// (procs/<proc>.log, on the host: the sandbox cannot touch it) and answers at once with the
// proc's ID. The log ends with the exit (or error) event; `deltabox logs` replays it and can
// follow it. procs/<proc>.json records the proc (and its key in the init), so a restarted
// daemon lists it again and follows it again (resumeProcs): OpAttach from the bytes of each
// stream its log already holds, to the exit.

// procLogCap bounds the output a detached exec's log keeps per stream (the rest is dropped and
// the exit status says so, as with output_cap).
const procLogCap = 16 << 20

// procPoll is how often a followed log is read again.
const procPoll = 50 * time.Millisecond

type procTable struct {
	mu    sync.Mutex
	seq   map[string]int
	procs map[string]map[string]*proc // sandbox -> proc
	gates map[string]*followGate      // sandbox -> its followers' gate
}

// followGate lets the daemon's connections that follow a sandbox's detached execs step aside
// while the init is parked for an L3 dump (a connection from the host is a socket CRIU cannot
// dump, and the init waits for them to close before it parks): pause cancels them and waits
// until they are closed, resume lets them attach again from what their logs hold.
type followGate struct {
	mu      sync.Mutex
	paused  bool
	resumed chan struct{}
	active  map[*proc]context.CancelFunc
	stopped map[*proc]bool // followers cancelled by pause
	wg      sync.WaitGroup
}

func (t *procTable) gate(sandbox string) *followGate {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gates == nil {
		t.gates = map[string]*followGate{}
	}
	g := t.gates[sandbox]
	if g == nil {
		g = &followGate{active: map[*proc]context.CancelFunc{}, stopped: map[*proc]bool{}}
		t.gates[sandbox] = g
	}
	return g
}

// enter waits while the gate is paused, then registers p's follower: the returned context
// is cancelled by pause; leave reports whether that happened.
func (g *followGate) enter(ctx context.Context, p *proc) (context.Context, func() bool) {
	g.mu.Lock()
	for g.paused {
		ch := g.resumed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		g.mu.Lock()
		if ctx.Err() != nil {
			break
		}
	}
	fctx, cancel := context.WithCancel(ctx)
	g.active[p] = cancel
	g.wg.Add(1)
	g.mu.Unlock()
	return fctx, func() bool {
		g.mu.Lock()
		stopped := g.stopped[p]
		delete(g.active, p)
		delete(g.stopped, p)
		g.mu.Unlock()
		cancel()
		g.wg.Done()
		return stopped
	}
}

// pause cancels the sandbox's followers and waits (at most wait) until they are gone.
func (g *followGate) pause(wait time.Duration) {
	g.mu.Lock()
	if !g.paused {
		g.paused, g.resumed = true, make(chan struct{})
	}
	for p, cancel := range g.active {
		g.stopped[p] = true
		cancel()
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
	}
}

func (g *followGate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		g.paused = false
		close(g.resumed)
	}
}

// follow runs a detached exec's follower (run: the exec itself, or an attach) to the exec's
// end; when the gate stopped it for a dump, it attaches again from what the log holds.
func (o *Orchestrator) follow(ctx context.Context, sandbox string, p *proc, lw *procLog, run func(context.Context) (initproto.ExitStatus, error)) (initproto.ExitStatus, error) {
	g := o.procs.gate(sandbox)
	for {
		fctx, leave := g.enter(ctx, p)
		st, err := run(fctx)
		if !leave() || o.closing() {
			return st, err
		}
		run = func(ctx context.Context) (initproto.ExitStatus, error) {
			return o.pools.Attach(ctx, sandbox, p.key, lw.bytes, lw.stream(false), lw.stream(true))
		}
	}
}

type proc struct {
	mu   sync.Mutex
	info api.Proc
	path string // the log
	key  string // its key in the init
	done chan struct{}
}

// procRecord is procs/<proc>.json.
type procRecord struct {
	api.Proc
	Key string `json:"key"`
}

func (p *proc) recordPath() string { return strings.TrimSuffix(p.path, ".log") + ".json" }

// save writes the proc's record (the caller holds p.mu).
func (p *proc) save() error {
	data, err := json.Marshal(procRecord{Proc: p.info, Key: p.key})
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(p.recordPath(), data, 0o600)
}

func (p *proc) snapshot() api.Proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

func (t *procTable) add(sandbox string, p *proc) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init(sandbox)
	t.seq[sandbox]++
	id := fmt.Sprintf("p%d", t.seq[sandbox])
	t.procs[sandbox][id] = p
	return id
}

func (t *procTable) init(sandbox string) {
	if t.procs == nil {
		t.seq, t.procs = map[string]int{}, map[string]map[string]*proc{}
	}
	if t.procs[sandbox] == nil {
		t.procs[sandbox] = map[string]*proc{}
	}
}

// put re-adds a proc loaded from its record (a restart) under its own ID.
func (t *procTable) put(sandbox string, p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init(sandbox)
	t.procs[sandbox][p.info.Proc] = p
	var n int
	if _, err := fmt.Sscanf(p.info.Proc, "p%d", &n); err == nil && n > t.seq[sandbox] {
		t.seq[sandbox] = n
	}
}

// forget drops a released sandbox's procs (their commands ended with the sandbox).
func (t *procTable) forget(sandbox string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.procs, sandbox)
	delete(t.seq, sandbox)
	delete(t.gates, sandbox)
}

func (t *procTable) get(sandbox, id string) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[sandbox][id]
	if !ok {
		return nil, fmt.Errorf("detached exec %q of sandbox %q: %w", id, sandbox, errdefs.ErrNotFound)
	}
	return p, nil
}

func (t *procTable) list(sandbox string) []api.Proc {
	t.mu.Lock()
	ps := make([]*proc, 0, len(t.procs[sandbox]))
	for _, p := range t.procs[sandbox] {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	out := make([]api.Proc, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.snapshot())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

// startDetached starts req in the sandbox of s and returns at once.
func (o *Orchestrator) startDetached(ctx context.Context, s *session, req api.ExecRequest) (api.Proc, error) {
	if req.Stdin {
		return api.Proc{}, fmt.Errorf("a detached exec takes no stdin: %w", errdefs.ErrInvalidArgument)
	}
	dir := filepath.Join(s.dir, "procs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return api.Proc{}, fmt.Errorf("detached exec log dir: %w", err)
	}
	p := &proc{info: api.Proc{Sandbox: s.id, Argv: req.Argv, Started: time.Now().UTC(), State: api.ProcRunning}, done: make(chan struct{})}
	p.info.Proc = o.procs.add(s.id, p)
	p.path = filepath.Join(dir, p.info.Proc+".log")
	f, err := os.OpenFile(p.path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return api.Proc{}, fmt.Errorf("detached exec log: %w", err)
	}
	p.key = s.id + "/" + p.info.Proc
	p.mu.Lock()
	err = p.save()
	p.mu.Unlock()
	if err != nil {
		f.Close()
		return api.Proc{}, fmt.Errorf("detached exec record: %w", err)
	}
	lw := &procLog{f: f}
	ctx = context.WithoutCancel(ctx)
	started, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		var once sync.Once
		st, err := o.follow(ctx, s.id, p, lw, func(ctx context.Context) (initproto.ExitStatus, error) {
			return o.pools.Exec(ctx, s.id, pool.ExecRequest{
				Argv: req.Argv, Env: req.Env, Workdir: req.Workdir, User: req.User,
				Timeout: time.Duration(req.TimeoutMS * float64(time.Millisecond)), OutputCap: req.OutputCap, Tag: req.Tag, Via: req.Via,
				Detach: p.key, Started: func(int) { once.Do(func() { close(started) }) },
			}, nil, lw.stream(false), lw.stream(true))
		})
		if o.closing() {
			f.Close() // the daemon stops: the command goes on; the next daemon follows it again
			return
		}
		o.endProc(ctx, s.id, p, lw, st, err)
	}()
	// Answer once the init runs it (or it ended): a daemon killed right after the answer
	// then finds it again in the init.
	select {
	case <-started:
	case <-ended:
	case <-time.After(10 * time.Second):
	}
	return p.snapshot(), nil
}

// endProc records a detached exec's end: the log's last event, the record, done.
func (o *Orchestrator) endProc(ctx context.Context, sandbox string, p *proc, lw *procLog, st initproto.ExitStatus, err error) {
	defer close(p.done)
	p.mu.Lock()
	p.info.State = api.ProcExited
	if err != nil {
		code, _ := api.FromError(err)
		p.info.Error = err.Error()
		lw.event(api.ExecEvent{Error: &api.Error{Code: code, Message: err.Error()}})
	} else {
		exit := apiExitStatus(st)
		exit.StdoutTruncated = exit.StdoutTruncated || lw.cut[0]
		exit.StderrTruncated = exit.StderrTruncated || lw.cut[1]
		p.info.Exit = &exit
		lw.event(api.ExecEvent{Exit: &exit})
	}
	if err := p.save(); err != nil {
		log.L(ctx).Warn("detached exec record", "sandbox", sandbox, "proc", p.info.Proc, "error", err)
	}
	p.mu.Unlock()
	if err := lw.f.Close(); err != nil {
		log.L(ctx).Warn("detached exec log", "sandbox", sandbox, "proc", p.info.Proc, "error", err)
	}
}

// resumeProcs lists again the detached execs of a session reopened after a restart, and
// follows the running ones again from what their logs hold.
func (o *Orchestrator) resumeProcs(ctx context.Context, s *session) {
	dir := filepath.Join(s.dir, "procs")
	recs, _ := filepath.Glob(filepath.Join(dir, "p*.json"))
	for _, path := range recs {
		data, err := os.ReadFile(path)
		var rec procRecord
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err != nil || rec.Proc.Proc == "" || rec.Key == "" {
			log.L(ctx).Warn("detached exec record unreadable; skipped", "path", path, "error", err)
			continue
		}
		p := &proc{info: rec.Proc, key: rec.Key, path: strings.TrimSuffix(path, ".json") + ".log", done: make(chan struct{})}
		o.procs.put(s.id, p)
		if p.info.State != api.ProcRunning {
			close(p.done)
			continue
		}
		lw, err := reopenProcLog(p.path)
		if err != nil {
			o.endProc(ctx, s.id, p, &procLog{f: discardFile()}, initproto.ExitStatus{}, fmt.Errorf("reopen the log after a restart: %w", err))
			continue
		}
		go func() {
			st, err := o.follow(ctx, s.id, p, lw, func(ctx context.Context) (initproto.ExitStatus, error) {
				return o.pools.Attach(ctx, s.id, p.key, lw.bytes, lw.stream(false), lw.stream(true))
			})
			if o.closing() {
				lw.f.Close()
				return
			}
			if errdefs.IsNotFound(err) {
				err = fmt.Errorf("the sandbox's init no longer holds this detached exec (its status was lost across the daemon restart): %w", errdefs.ErrDataLoss)
			}
			o.endProc(ctx, s.id, p, lw, st, err)
		}()
	}
}

// reopenProcLog opens a detached exec's log for appending after a restart: a line cut by the
// crash is dropped, and the stdout and stderr bytes it holds are counted (where the init
// resumes).
func reopenProcLog(path string) (*procLog, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	lw := &procLog{f: f}
	br := bufio.NewReader(f)
	var good int64
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			break
		}
		var ev api.ExecEvent
		if json.Unmarshal(line, &ev) == nil {
			lw.bytes[0] += int64(len(ev.Stdout))
			lw.bytes[1] += int64(len(ev.Stderr))
		}
		good += int64(len(line))
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return lw, nil
}

// closing reports whether the daemon is stopping: a detached exec's connection to the init
// closes with it, and the command runs on (the next daemon follows it again).
func (o *Orchestrator) closing() bool { return o.closed.Load() }

func discardFile() *os.File {
	f, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	return f
}

// procLog writes ExecEvent lines to a detached exec's log.
type procLog struct {
	mu    sync.Mutex
	f     *os.File
	bytes [2]int64
	cut   [2]bool
}

func (l *procLog) event(ev api.ExecEvent) {
	data, _ := json.Marshal(ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(data, '\n'))
}

type procStream struct {
	l *procLog
	i int // 0 stdout, 1 stderr
}

func (l *procLog) stream(stderr bool) io.Writer {
	if stderr {
		return procStream{l, 1}
	}
	return procStream{l, 0}
}

func (s procStream) Write(p []byte) (int, error) {
	s.l.mu.Lock()
	room := procLogCap - s.l.bytes[s.i]
	keep := p
	if int64(len(keep)) > room {
		keep = keep[:max(room, 0)]
		s.l.cut[s.i] = true
	}
	s.l.bytes[s.i] += int64(len(keep))
	s.l.mu.Unlock()
	if len(keep) > 0 {
		ev := api.ExecEvent{Stdout: keep}
		if s.i == 1 {
			ev = api.ExecEvent{Stderr: keep}
		}
		s.l.event(ev)
	}
	return len(p), nil
}

// procLogs streams a detached exec's log (ExecEvent lines); with ?follow=true it goes on
// until the exit event.
func (o *Orchestrator) procLogs(w http.ResponseWriter, r *http.Request) {
	ctx, id := r.Context(), r.PathValue("id")
	if _, err := o.session(ctx, id); err != nil {
		writeError(ctx, w, err)
		return
	}
	p, err := o.procs.get(id, r.PathValue("proc"))
	var f *os.File
	if err == nil {
		f, err = os.Open(p.path)
	}
	if err != nil {
		writeError(ctx, w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	rc := http.NewResponseController(w)
	follow := r.URL.Query().Get("follow") == "true"
	br := bufio.NewReader(f)
	var partial []byte
	for {
		line, err := br.ReadBytes('\n')
		partial = append(partial, line...)
		if err == nil { // whole lines only: the writer may be mid-line
			if _, werr := w.Write(partial); werr != nil {
				return
			}
			partial = partial[:0]
			continue
		}
		_ = rc.Flush()
		if !follow {
			return
		}
		select {
		case <-p.done:
			rest, _ := io.ReadAll(br) // the exit line is written before done closes
			w.Write(append(partial, rest...))
			return
		case <-ctx.Done():
			return
		case <-time.After(procPoll):
		}
	}
}
