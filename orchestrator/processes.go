package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/criu/proctpl"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// procCheckpoint is the process half of a checkpoint taken with processes: how each
// process of the sandbox (but its init) is kept. The templates themselves live in the
// session (s.tpls): they do not survive the daemon (PTRACE_O_EXITKILL kills them with it).
type procCheckpoint struct {
	Procs []procEntry `json:"procs"`
}

// procEntry is one process of a procCheckpoint.
type procEntry struct {
	pool.Proc        // host pid and start time at the cut
	NSPid     int    `json:"ns_pid"` // pid in the sandbox
	Comm      string `json:"comm"`
	Kept      string `json:"kept"` // api.KeptTemplate, api.KeptCRIU or api.KeptNone
	Reason    string `json:"reason,omitempty"`
}

// procCut carries the processes seized in a checkpoint's frozen window to their templates.
type procCut struct {
	entries []procEntry
	procs   []*proctpl.Proc // entries[i] is procs[i] (nil: not seized, see its Reason)
}

// tracer returns the node's ptrace thread, started on first use.
func (o *Orchestrator) tracer() *proctpl.Tracer {
	o.tracerOnce.Do(func() { o.ptrace = proctpl.NewTracer() })
	return o.ptrace
}

// wantsProcesses resolves a checkpoint request's processes flag against the pool default.
func (o *Orchestrator) wantsProcesses(s *session, req api.CheckpointRequest) (bool, error) {
	want := false
	if o.pools != nil { // the pool's default (unit tests run without a pool manager)
		if t, err := o.pools.Template(s.sb.Pool); err == nil {
			want = t.CheckpointProcesses
		}
	}
	if req.Processes != nil {
		want = *req.Processes
	}
	if want && req.Level == api.LevelL3 {
		if req.Processes != nil {
			return false, fmt.Errorf("an l3 checkpoint keeps processes with CRIU; --processes is for l1 and l2: %w", errdefs.ErrInvalidArgument)
		}
		want = false
	}
	return want, nil
}

// seizeProcesses seizes and interrupts every process of the frozen sandbox but its init and
// the templates of earlier checkpoints; they stop for the tracer as soon as they are thawed,
// before running on (the cut stays the frozen one). A process that cannot be seized is
// recorded with the reason.
func (o *Orchestrator) seizeProcesses(s *session, procs []pool.Proc, noFallback string) *procCut {
	pc := &procCut{}
	tpls := s.templatePids()
	for _, p := range procs {
		if p.Pid == int(s.sb.InitPid) || tpls[p.Pid] || exited(p.Pid) {
			continue
		}
		e := procEntry{Proc: p, Kept: api.KeptTemplate}
		e.NSPid, e.Comm = nsPidComm(p.Pid)
		proc, err := o.tracer().Seize(p.Pid, func(pid int) error { return s.checkMember(pid, p.Start) })
		if err != nil {
			e.Kept, e.Reason = api.KeptNone, err.Error()
			if errors.Is(err, proctpl.ErrMultiThreaded) {
				e.Reason = "multi-threaded: a template copies one thread; no CRIU fallback: " + noFallback
				if noFallback == "" {
					e.Reason += "it started a thread during the checkpoint"
				}
			}
		}
		pc.entries = append(pc.entries, e)
		pc.procs = append(pc.procs, proc)
	}
	return pc
}

// checkMember checks, once the caller holds a pidfd of pid, that pid is still the process
// the frozen sandbox's cgroup listed: same start time (a reused pid has another; a frozen
// process cannot leave the cgroup).
func (s *session) checkMember(pid int, start uint64) error {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return fmt.Errorf("process %d: %w (%w)", pid, err, errdefs.ErrNotFound)
	}
	i := strings.LastIndexByte(string(data), ')') // comm may hold spaces and parentheses
	f := strings.Fields(string(data[i+1:]))
	if i < 0 || len(f) < 20 || f[19] != strconv.FormatUint(start, 10) {
		return fmt.Errorf("process %d is not the one the sandbox listed (pid reused): %w", pid, errdefs.ErrNotFound)
	}
	return nil
}

// templateProcesses makes the templates of the seized processes once the sandbox is thawed
// and resumes every seized process, whatever fails (a failure is that process's Reason).
// It returns the templates by entry host pid.
func (o *Orchestrator) templateProcesses(ctx context.Context, pc *procCut) (*procCheckpoint, map[int]*proctpl.Template) {
	tpls := map[int]*proctpl.Template{}
	for i, p := range pc.procs {
		if p == nil {
			continue
		}
		e := &pc.entries[i]
		err := p.Wait()
		var tp *proctpl.Template
		if err == nil {
			tp, err = p.Template()
		}
		if rerr := p.Resume(); rerr != nil {
			log.L(ctx).Warn("resume process after its template", "pid", p.Pid(), "error", rerr)
		}
		if err != nil {
			e.Kept, e.Reason = api.KeptNone, err.Error()
			continue
		}
		tpls[e.Pid] = tp
	}
	return &procCheckpoint{Procs: pc.entries}, tpls
}

// exited reports whether pid is a zombie (it exited; its parent has not reaped it yet) or
// gone: there is nothing of it to keep.
func exited(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 || i+2 >= len(data) {
		return false
	}
	return data[i+2] == 'Z' || data[i+2] == 'X'
}

// nsPidComm reads a process's pid in its own pid namespace and its command name.
func nsPidComm(pid int) (int, string) {
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	ns := 0
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				ns, _ = strconv.Atoi(f[len(f)-1])
			}
		}
	}
	return ns, strings.TrimSpace(string(comm))
}

// templatePids returns the host pids of the session's live templates.
func (s *session) templatePids() map[int]bool {
	out := map[int]bool{}
	for _, byPid := range s.tpls {
		for _, tp := range byPid {
			out[tp.Pid()] = true
		}
	}
	return out
}

// templateCheckpoints lists the checkpoints that hold templates.
func (s *session) templateCheckpoints() []string {
	var out []string
	for id, byPid := range s.tpls {
		if len(byPid) > 0 {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return ckptNum(out[i]) < ckptNum(out[j]) })
	return out
}

// withoutTemplates drops the session's templates from a process list.
func (s *session) withoutTemplates(procs []pool.Proc) []pool.Proc {
	tpls := s.templatePids()
	if len(tpls) == 0 {
		return procs
	}
	out := make([]pool.Proc, 0, len(procs))
	for _, p := range procs {
		if !tpls[p.Pid] {
			out = append(out, p)
		}
	}
	return out
}

// killForCopies SIGKILLs every process of the (frozen) sandbox (the templates excluded from
// now) before a rollback to a checkpoint with processes starts its copies, but its init and
// the processes of the checkpoint that no template can bring back (keep): those run on as
// they are, as in a rollback of files only.
func killForCopies(frz freezer, now []pool.Proc, keep map[pool.Proc]bool, init int) int {
	var pids []int
	for _, p := range now {
		if p.Pid != init && !keep[p] {
			pids = append(pids, p.Pid)
		}
	}
	if len(pids) == 0 {
		return 0
	}
	return frz.Kill(pids)
}

// unrestorable returns the processes of a checkpoint with processes that have no live
// template (the daemon restarted, the template was killed or evicted, or none was made).
func (s *session) unrestorable(target ckptRecord) map[pool.Proc]bool {
	out := map[pool.Proc]bool{}
	for _, e := range target.ProcCkpt.Procs {
		if tp := s.tpls[target.ID][e.Pid]; e.Kept != api.KeptTemplate || tp == nil || !tp.Alive() {
			out[e.Proc] = true
		}
	}
	return out
}

// restoreProcessCheckpoint starts a fresh copy of each process the target keeps as a
// template (the sandbox runs; the processes of the rollback's start were killed). What it
// cannot bring back is listed in res.ProcessesLost, with the reason.
func (o *Orchestrator) restoreProcessCheckpoint(ctx context.Context, s *session, target ckptRecord, res *api.RollbackResult) error {
	if target.ProcCkpt == nil {
		return nil
	}
	start := time.Now()
	tpls := s.tpls[target.ID]
	for _, e := range target.ProcCkpt.Procs {
		lost := api.CheckpointProcess{Pid: e.NSPid, Comm: e.Comm, Kept: e.Kept, Reason: e.Reason}
		if e.Kept != api.KeptTemplate {
			lost.Reason += "; if it still ran, it was left running as it is"
			res.ProcessesLost = append(res.ProcessesLost, lost)
			continue
		}
		tp := tpls[e.Pid]
		switch {
		case tp == nil:
			lost.Reason = s.templateGone(target.ID)
		case !tp.Alive():
			lost.Reason = "its template was killed (from inside the sandbox?)"
			delete(tpls, e.Pid)
			s.tplCount.Add(-1)
		default:
			if _, err := tp.Copy(); err != nil {
				lost.Reason = err.Error()
			} else {
				res.ProcessesRestored++
				continue
			}
		}
		lost.Reason += "; if it still ran, it was left running as it is"
		res.ProcessesLost = append(res.ProcessesLost, lost)
	}
	log.L(ctx).Debug("processes restored from templates", "sandbox", s.id, "checkpoint", target.ID,
		"restored", res.ProcessesRestored, "lost", len(res.ProcessesLost), "took", time.Since(start))
	return nil
}

// releaseAllTemplates kills and collects every template of a sandbox (release).
func (o *Orchestrator) releaseAllTemplates(id string) {
	o.mu.Lock()
	s, ok := o.sessions[id]
	o.mu.Unlock()
	if !ok {
		return
	}
	<-s.ready
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseTemplates("")
}

// releaseTemplates kills and collects a checkpoint's templates ("" for all of them).
func (s *session) releaseTemplates(id string) {
	for ck, byPid := range s.tpls {
		if id != "" && ck != id {
			continue
		}
		for _, tp := range byPid {
			tp.Release()
		}
		s.tplCount.Add(-int64(len(byPid)))
		delete(s.tpls, ck)
	}
}

// processView is a checkpoint's API view of its processes, and its templates' memory.
func (s *session) processView(c ckptRecord) ([]api.CheckpointProcess, int64) {
	if c.ProcCkpt == nil {
		return nil, 0
	}
	out := make([]api.CheckpointProcess, 0, len(c.ProcCkpt.Procs))
	var bytes int64
	for _, e := range c.ProcCkpt.Procs {
		v := api.CheckpointProcess{Pid: e.NSPid, Comm: e.Comm, Kept: e.Kept, Reason: e.Reason}
		if e.Kept == api.KeptTemplate {
			if tp := s.tpls[c.ID][e.Pid]; tp == nil {
				v.Kept, v.Reason = api.KeptNone, s.templateGone(c.ID)
			} else {
				bytes += tp.Bytes()
			}
		}
		out = append(out, v)
	}
	return out, bytes
}

// cutFunc is a checkpoint's frozen window (cut, cutL3, cutWithProcesses).
type cutFunc func(ctx context.Context, s *session, level overlay.Level, rec *ckptRecord) (time.Duration, pendingFiles, error)

// cutWithProcesses is cut plus the processes: in the frozen window every process is seized
// and interrupted; after the thaw each stops for the tracer before running on, gets its
// template and is resumed. The window reported runs from the freeze to the last resume. The
// templates go to *out.
func (o *Orchestrator) cutWithProcesses(out *map[int]*proctpl.Template, noFallback string) cutFunc {
	return func(ctx context.Context, s *session, level overlay.Level, rec *ckptRecord) (time.Duration, pendingFiles, error) {
		start := time.Now()
		if err := s.frz.Freeze(ctx); err != nil {
			return 0, nil, err
		}
		frozenAt := time.Now()
		procs, err := s.frz.Procs()
		if err != nil {
			_ = o.thaw(ctx, s)
			return 0, nil, err
		}
		pc := o.seizeProcesses(s, procs, noFallback)
		pending, err := o.capture(ctx, s, level, rec)
		if err == nil {
			err = failpoint.Inject("checkpoint/captured")
		}
		if terr := o.thaw(ctx, s); err == nil {
			err = terr
		}
		if err != nil {
			pc.release(ctx)
			if pending != nil {
				pending.Abort()
			}
			return 0, nil, err
		}
		thawed := time.Now()
		rec.ProcCkpt, *out = o.templateProcesses(ctx, pc)
		resumed := time.Now()
		log.L(ctx).Debug("checkpoint cut with processes", "sandbox", s.id, "checkpoint", rec.ID,
			"freeze", frozenAt.Sub(start), "capture", thawed.Sub(frozenAt), "templates", resumed.Sub(thawed),
			"processes", len(pc.entries), "templated", len(*out))
		return resumed.Sub(frozenAt), pending, nil
	}
}

// release resumes every seized process without templates (a failed cut). The sandbox is
// thawed: each first stops for the tracer, then is detached.
func (pc *procCut) release(ctx context.Context) {
	for _, p := range pc.procs {
		if p == nil {
			continue
		}
		_ = p.Wait()
		if err := p.Resume(); err != nil {
			log.L(ctx).Warn("resume process after a failed checkpoint", "pid", p.Pid(), "error", err)
		}
	}
}
