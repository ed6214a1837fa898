package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
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
	// seizeSpans are, per entry, its membership check, seize and Inspect (logged).
	seizeSpans [][3]time.Duration
}

// tracer returns the i-th of the node's ptrace threads (modulo their number), started on
// first use. There is one per core (at most 4): the processes of one checkpoint are seized
// round-robin, so that their templates are made, and later their copies started, in
// parallel (a template is traced by the thread that made it, for its whole life).
func (o *Orchestrator) tracer(i int) *proctpl.Tracer {
	o.tracerOnce.Do(func() {
		for range max(1, min(runtime.NumCPU(), 4)) {
			o.ptrace = append(o.ptrace, proctpl.NewTracer())
		}
	})
	return o.ptrace[i%len(o.ptrace)]
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
		pc.entries = append(pc.entries, procEntry{Proc: p, Kept: api.KeptTemplate}) // NSPid and Comm: named
	}
	pc.procs = make([]*proctpl.Proc, len(pc.entries))
	pc.seizeSpans = make([][3]time.Duration, len(pc.entries))
	// One goroutine per process, round-robin over the tracer threads: the seizes of one
	// checkpoint run in parallel, as its templates do (this is inside the frozen window).
	var wg sync.WaitGroup
	for i := range pc.entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := &pc.entries[i]
			start, t0 := e.Start, time.Now()
			var t1 time.Time
			proc, err := o.tracer(i).Seize(e.Pid, func(pid int) error { err := s.checkMember(pid, start); t1 = time.Now(); return err })
			t2 := time.Now()
			if err == nil {
				proc.Inspect() // frozen: what Wait would read after the thaw
				pc.seizeSpans[i] = [3]time.Duration{t1.Sub(t0), t2.Sub(t1), time.Since(t2)}
			} else {
				e.Kept, e.Reason = api.KeptNone, err.Error()
				if errors.Is(err, proctpl.ErrMultiThreaded) {
					e.Reason = "multi-threaded: a template copies one thread; no CRIU fallback: " + noFallback
					if noFallback == "" {
						e.Reason += "it started a thread during the checkpoint"
					}
				}
			}
			pc.procs[i] = proc
		}()
	}
	wg.Wait()
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
// Processes on different tracer threads are done in parallel, each in one request to its
// thread (proctpl.Proc.Keep). It returns the templates by entry host pid and when the last
// process was resumed; the per-process spans are logged after that, not between.
func (o *Orchestrator) templateProcesses(ctx context.Context, pc *procCut) (*procCheckpoint, map[int]*proctpl.Template, time.Time) {
	made := make([]*proctpl.Template, len(pc.procs))
	kept := make([]proctpl.Kept, len(pc.procs))
	started := time.Now()
	var wg sync.WaitGroup
	for i, p := range pc.procs {
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := p.Keep(func() error { return failpoint.Inject("checkpoint/template") })
			kept[i] = k
			if err != nil {
				e := &pc.entries[i]
				e.Kept, e.Reason = api.KeptNone, err.Error()
				return
			}
			made[i] = k.Template
		}()
	}
	wg.Wait()
	last := started
	tpls := map[int]*proctpl.Template{}
	for i, tp := range made {
		k := kept[i]
		if k.Resumed.After(last) {
			last = k.Resumed
		}
		if pc.procs[i] == nil {
			continue
		}
		if k.ResumeErr != nil {
			log.L(ctx).Warn("resume process after its template", "pid", pc.procs[i].Pid(), "error", k.ResumeErr)
		}
		log.L(ctx).Debug("process template", "pid", pc.procs[i].Pid(), "wait", k.Stopped.Sub(started),
			"template", k.Templated.Sub(k.Stopped), "resume", k.Resumed.Sub(k.Templated))
		if tp != nil {
			tpls[pc.entries[i].Pid] = tp
		}
	}
	return &procCheckpoint{Procs: pc.entries}, tpls, last
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

// templatePids returns the host pids of the session's live templates and of their spare
// copies (made ahead by preforkSpares).
func (s *session) templatePids() map[int]bool {
	out := map[int]bool{}
	for _, byPid := range s.tpls {
		for _, tp := range byPid {
			out[tp.Pid()] = true
			if sp := tp.SparePid(); sp != 0 {
				out[sp] = true
			}
		}
	}
	return out
}

// preforkLater has the templates of checkpoint ck fork their spare copies once the caller
// released the session (after the answer): the next rollback to ck then starts those copies
// instead of forking (the fork of a process with 50 MB of heap copies its page tables,
// ~1-2 ms here). It runs under the session lock (shared, as every background step: the
// readers go on), so that no checkpoint or rollback lists the sandbox's processes while a
// spare is being made (it would not be known as one yet).
// Only one checkpoint's templates keep spares per sandbox (the newest one, or the last one
// rolled back to): a spare is a stopped process that counts in the sandbox's pid limit.
func (o *Orchestrator) preforkLater(ctx context.Context, s *session, ck string) {
	s.background(ctx, func(ctx context.Context) { o.preforkSpares(ctx, s, ck) })
}

// preforkSpares is preforkLater's work. Callers hold s.mu, exclusive or as background does.
func (o *Orchestrator) preforkSpares(ctx context.Context, s *session, ck string) {
	if s.spares != ck {
		for _, tp := range s.tpls[s.spares] {
			tp.DropSpare()
		}
		s.spares = ck
	}
	for _, tp := range s.tpls[ck] {
		if err := tp.Prefork(s.frz.Park); err != nil {
			log.L(ctx).Debug("spare copy of a template", "sandbox", s.id, "checkpoint", ck, "pid", tp.Origin, "error", err)
		}
	}
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

// sandboxProcs lists the processes of the sandbox's run: its cgroup's, without the
// templates and their spares (stopped, they never write a file nor need a kill), whose
// /proc entries are then not read at all.
func (s *session) sandboxProcs() ([]pool.Proc, error) {
	if s.frozenProcs != nil { // frozen by s.freeze: the list taken meanwhile, brought up to date
		return s.frozenProcs.Procs()
	}
	return s.frz.ProcsExcept(s.templatePids())
}

// killForCopies SIGKILLs every process of the (frozen) sandbox (the templates excluded from
// now) before a rollback to a checkpoint with processes starts its copies, but its init and
// the processes of the checkpoint that no template can bring back (keep): those run on as
// they are, as in a rollback of files only.
func killForCopies(kill func([]int) int, now []pool.Proc, keep map[pool.Proc]bool, init int) int {
	var pids []int
	for _, p := range now {
		if p.Pid != init && !keep[p] {
			pids = append(pids, p.Pid)
		}
	}
	if len(pids) == 0 {
		return 0
	}
	return kill(pids)
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
// template (the sandbox runs; the processes of the rollback's start were killed), in
// parallel across the tracer threads. What it cannot bring back is listed in
// res.ProcessesLost, with the reason.
func (o *Orchestrator) restoreProcessCheckpoint(ctx context.Context, s *session, target ckptRecord, res *api.RollbackResult) error {
	if target.ProcCkpt == nil {
		return nil
	}
	start := time.Now()
	tpls := s.tpls[target.ID]
	entries := target.ProcCkpt.Procs
	started := s.started // started in the frozen window (armedCopies)
	s.started = nil
	lost := make([]string, len(entries)) // why entry i was not restored
	ok := make([]bool, len(entries))
	copies := make([]int, len(entries)) // the pid of entry i's copy
	var wg sync.WaitGroup
	for i, e := range entries {
		tp := tpls[e.Pid]
		switch {
		case started[e.Pid]:
			ok[i] = true
		case e.Kept != api.KeptTemplate:
			lost[i] = e.Reason
		case tp == nil:
			lost[i] = s.templateGone(target.ID)
		case !tp.Alive():
			lost[i] = "its template was killed (from inside the sandbox?)"
			delete(tpls, e.Pid)
			s.tplCount.Add(-1)
		default:
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0, spare := time.Now(), tp.SparePid()
				defer func() {
					log.L(ctx).Debug("process copy", "sandbox", s.id, "pid", e.Pid, "spare", spare != 0, "took", time.Since(t0))
				}()
				if pid, err := tp.Copy(); err != nil {
					lost[i] = err.Error()
				} else {
					ok[i], copies[i] = true, pid
				}
			}()
		}
	}
	wg.Wait()
	for i, e := range entries {
		if ok[i] {
			s.sawHuge(copies[i]) // a copy shares its template's pages
			res.ProcessesRestored++
			continue
		}
		res.ProcessesLost = append(res.ProcessesLost, api.CheckpointProcess{Pid: e.NSPid, Comm: e.Comm, Kept: e.Kept,
			Reason: lost[i] + "; if it still ran, it was left running as it is"})
	}
	log.L(ctx).Debug("processes restored from templates", "sandbox", s.id, "checkpoint", target.ID,
		"restored", res.ProcessesRestored, "lost", len(res.ProcessesLost), "took", time.Since(start))
	return nil
}

// armedCopies are the copies of a rollback target's templates prepared in the rollback's
// frozen window, from spares parked out of the sandbox's freezer cgroup (preforkSpares):
// their file offsets, dumpable flag and registers are set while the sandbox is frozen (so
// nothing of the sandbox can reach them), then each is moved into the frozen sandbox, still
// stopped by the tracer, all in parallel with the files' rollback; they are started (each
// detached, on its tracer thread, side by side) once every step is done: they run with the
// thaw. A copy moved in but not started is killed (cancel); it dies with the thaw.
type armedCopies struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	tpls    map[int]*proctpl.Template // by entry host pid
	pids    map[int]int               // entry host pid -> armed copy
	armedAt time.Time                 // when start found every copy armed
}

// armCopies starts arming the target's parked spares (nothing for a checkpoint without
// processes, or templates without one: they fork their copies after the thaw).
func (o *Orchestrator) armCopies(s *session, target ckptRecord) *armedCopies {
	a := &armedCopies{tpls: map[int]*proctpl.Template{}, pids: map[int]int{}}
	if target.ProcCkpt == nil {
		return a
	}
	for _, e := range target.ProcCkpt.Procs {
		tp := s.tpls[target.ID][e.Pid]
		if e.Kept != api.KeptTemplate || tp == nil || tp.SparePid() == 0 {
			continue
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			pid, err := tp.Arm()
			if err != nil || pid == 0 {
				return
			}
			// Moved while stopped, the copy is frozen at its start: no instant of it
			// runs outside the sandbox's freezing.
			if err := s.frz.Adopt(pid); err != nil {
				tp.Disarm()
				return
			}
			a.mu.Lock()
			a.tpls[e.Pid], a.pids[e.Pid] = tp, pid
			a.mu.Unlock()
		}()
	}
	return a
}

// start starts the armed copies, already in the frozen sandbox (they run with the thaw), in
// parallel; it returns the entries started.
func (a *armedCopies) start() map[int]bool {
	a.wg.Wait()
	a.armedAt = time.Now()
	started := map[int]bool{}
	var wg sync.WaitGroup
	for e := range a.pids {
		tp := a.tpls[e]
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := tp.Copy(); err == nil {
				a.mu.Lock()
				started[e] = true
				a.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return started
}

// cancel kills the armed copies of a rollback that failed.
func (a *armedCopies) cancel() {
	a.wg.Wait()
	for e := range a.pids {
		a.tpls[e].Disarm()
	}
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
		delete(s.tplUsed, ck)
	}
}

// processViewMeasured is a checkpoint's API view of its processes, and its templates'
// memory; measure false leaves the memory out (0): reading it walks each template's page
// tables (smaps_rollup: ~1-2 ms for 50 MB of heap), and a template just made shares every
// page with its process.
func (s *session) processViewMeasured(c ckptRecord, measure bool) ([]api.CheckpointProcess, int64) {
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
			} else if measure {
				bytes += tp.Bytes()
			}
		}
		out = append(out, v)
	}
	return out, bytes
}

// cutFunc is a checkpoint's frozen window (cut, cutL3, cutWithProcesses).
type cutFunc func(ctx context.Context, s *session, level overlay.Level, rec *ckptRecord) (time.Duration, pendingFiles, error)

// procsPending is the template half of a checkpoint with processes, which runs once the
// sandbox is thawed (the seized processes stay stopped until their templates are made); the
// checkpoint's record waits for it (record).
type procsPending struct {
	done   chan struct{}
	ckpt   *procCheckpoint
	tpls   map[int]*proctpl.Template
	frozen time.Duration // from the freeze to the last resume
}

// wait waits for the templates and returns the checkpoint's process half as made, its
// templates by entry host pid, and the window from the freeze to the last resume.
func (p *procsPending) wait() (*procCheckpoint, map[int]*proctpl.Template, time.Duration) {
	<-p.done
	return p.ckpt, p.tpls, p.frozen
}

// cutWithProcesses is cut plus the processes: in the frozen window every process is seized
// and interrupted; after the thaw each stops for the tracer before running on, gets its
// template and is resumed, in the background (*out): rec.ProcCkpt is the cut's prediction
// (each seized process templated), which the durable record keeps; *out's wait gives the
// process half as made (a template that failed says why) and the window reported, from the
// freeze to the last resume. The duration returned is the sandbox's freeze alone.
func (o *Orchestrator) cutWithProcesses(out **procsPending, noFallback string) cutFunc {
	return func(ctx context.Context, s *session, level overlay.Level, rec *ckptRecord) (time.Duration, pendingFiles, error) {
		start := time.Now()
		if err := s.freeze(ctx, s.pin()); err != nil {
			return 0, nil, err
		}
		frozenAt := time.Now()
		procs, err := s.sandboxProcs()
		if err != nil {
			_ = o.thaw(ctx, s)
			return 0, nil, err
		}
		listed := time.Now()
		// The seizes (ptrace requests on the tracer threads) and the files' capture (this
		// goroutine) run side by side: neither needs the other, both need the freeze.
		var pc *procCut
		var seizesDone time.Time
		seizing := make(chan struct{})
		go func() {
			defer close(seizing)
			pc = o.seizeProcesses(s, procs, noFallback)
			seizesDone = time.Now()
		}()
		pending, err := o.capture(ctx, s, level, rec, procs)
		captured := time.Now()
		<-seizing
		seized := time.Now()
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
		// The prediction, named while the seized processes are stopped (their pid in the
		// sandbox and command name cannot change meanwhile), before the templates start
		// writing their entries.
		predicted := slices.Clone(pc.entries)
		pp := &procsPending{done: make(chan struct{})}
		named := make(chan struct{})
		go func() {
			defer close(pp.done)
			ckpt, tpls, resumed := o.templateProcesses(ctx, pc)
			<-named
			for i := range ckpt.Procs { // names: read into the prediction below
				e := &ckpt.Procs[i]
				e.NSPid, e.Comm = predicted[i].NSPid, predicted[i].Comm
				if tp := tpls[e.Pid]; e.Comm == "" && tp != nil { // it exited: its template's name
					_, e.Comm = nsPidComm(tp.Pid())
				}
			}
			pp.ckpt, pp.tpls, pp.frozen = ckpt, tpls, resumed.Sub(frozenAt)
			log.L(ctx).Debug("checkpoint cut with processes", "sandbox", s.id, "checkpoint", rec.ID,
				"freeze", frozenAt.Sub(start), "procs", listed.Sub(frozenAt), "seize_capture", seized.Sub(listed), "seizes", seizesDone.Sub(listed), "capture", captured.Sub(listed), "thaw", thawed.Sub(seized), "templates", resumed.Sub(thawed),
				"processes", len(pc.entries), "templated", len(tpls))
			for i, sp := range pc.seizeSpans {
				log.L(ctx).Debug("process seized", "pid", pc.entries[i].Pid, "check", sp[0], "seize", sp[1], "inspect", sp[2])
			}
		}()
		for i := range predicted {
			predicted[i].NSPid, predicted[i].Comm = nsPidComm(predicted[i].Pid)
		}
		close(named)
		rec.ProcCkpt = &procCheckpoint{Procs: predicted}
		*out = pp
		return thawed.Sub(frozenAt), pending, nil
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
