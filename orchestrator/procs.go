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
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// Detached execs (`deltabox exec -d`): the daemon runs the command as any exec, writes its
// output to a log of ExecEvent lines in the lease's directory (procs/<proc>.log, on the host:
// the sandbox cannot touch it) and answers at once with the proc's ID. The log ends with the
// exit (or error) event; `deltabox logs` replays it and can follow it. Procs are kept in
// memory: a restarted daemon forgets them (the commands it ran are gone with it, as any exec).

// procLogCap bounds the output a detached exec's log keeps per stream (the rest is dropped and
// the exit status says so, as with output_cap).
const procLogCap = 16 << 20

// procPoll is how often a followed log is read again.
const procPoll = 50 * time.Millisecond

type procTable struct {
	mu    sync.Mutex
	seq   map[string]int
	procs map[string]map[string]*proc // sandbox -> proc
}

type proc struct {
	mu   sync.Mutex
	info api.Proc
	path string
	done chan struct{}
}

func (p *proc) snapshot() api.Proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

func (t *procTable) add(sandbox string, p *proc) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs == nil {
		t.seq, t.procs = map[string]int{}, map[string]map[string]*proc{}
	}
	t.seq[sandbox]++
	id := fmt.Sprintf("p%d", t.seq[sandbox])
	if t.procs[sandbox] == nil {
		t.procs[sandbox] = map[string]*proc{}
	}
	t.procs[sandbox][id] = p
	return id
}

// forget drops a released sandbox's procs (their commands ended with the sandbox).
func (t *procTable) forget(sandbox string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.procs, sandbox)
	delete(t.seq, sandbox)
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
	lw := &procLog{f: f}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer close(p.done)
		st, err := o.pools.Exec(ctx, s.id, pool.ExecRequest{
			Argv: req.Argv, Env: req.Env, Workdir: req.Workdir, User: req.User,
			Timeout: time.Duration(req.TimeoutMS * float64(time.Millisecond)), OutputCap: req.OutputCap, Tag: req.Tag, Via: req.Via,
		}, nil, lw.stream(false), lw.stream(true))
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
		p.mu.Unlock()
		if err := f.Close(); err != nil {
			log.L(ctx).Warn("detached exec log", "sandbox", s.id, "proc", p.info.Proc, "error", err)
		}
	}()
	return p.snapshot(), nil
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
