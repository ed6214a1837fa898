package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/state"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// The fakes stand for the session's seams (seams.go); they keep their "disk" in memory, so
// that a second session opened on the same fakes sees what the first one left: a restart.

type fakeFreezer struct {
	mu     sync.Mutex
	frozen bool
	procs  []pool.Proc
	killed []int // pids passed to Kill
}

func (f *fakeFreezer) Freeze(context.Context) error  { f.set(true); return nil }
func (f *fakeFreezer) Pin(map[int]bool) *pool.Pinned { return nil }
func (f *fakeFreezer) Thaw() error                   { f.set(false); return nil }
func (f *fakeFreezer) Procs() ([]pool.Proc, error)   { return f.procs, nil }
func (f *fakeFreezer) Park(int) error                { return pool.ErrCannotPark }
func (f *fakeFreezer) Adopt(int) error               { return nil }
func (f *fakeFreezer) ProcsExcept(skip map[int]bool) ([]pool.Proc, error) {
	var out []pool.Proc
	for _, p := range f.procs {
		if !skip[p.Pid] {
			out = append(out, p)
		}
	}
	return out, nil
}
func (f *fakeFreezer) Kill(pids []int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killed = append(f.killed, pids...)
	return len(pids)
}
func (f *fakeFreezer) set(v bool)     { f.mu.Lock(); f.frozen = v; f.mu.Unlock() }
func (f *fakeFreezer) isFrozen() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.frozen }

// fakeFiles is a layer store: a tree of checkpoints with their records, its head, and
// "files", the checkpoint the live tree equals (or "dirty").
type fakeFiles struct {
	ids       []string
	head      string
	headMeta  []byte
	meta      map[string][]byte
	files     string
	rollbacks int
	prepared  int    // PrepareRollback calls
	aborted   int    // prepared rollbacks aborted
	onPrepare func() // called by PrepareRollback
	onApply   func() // called when a prepared rollback is applied
	failRoll  error
	deleted   []string
	// unwritten: a Deferred rollback's record is not yet written; disk* is the head a
	// crash leaves until it is (crash). failPersist fails the next PersistRollback.
	unwritten   bool
	unsynced    bool // WriteRollback put the record in place, not yet synced
	failWrite   error
	syncs       int // SyncRollback calls
	diskHead    string
	diskMeta    []byte
	failPersist error
	entries     map[string]int  // Entries, by checkpoint (0 when unset)
	foldMu      sync.Mutex      // guards folds: PrepareFold runs without the session lock
	folds       [][]string      // PrepareFold calls
	refuseFolds atomic.Bool     // every fold's Commit fails as overtaken
	compacts    []string        // PrepareCompact calls
	levels      []overlay.Level // the levels captures were asked for
	onFold      func()          // called by PrepareFold, before it returns (the session lock is free)
}

func (f *fakeFiles) PersistRollback() error {
	if err := f.failPersist; err != nil {
		f.failPersist = nil
		return err
	}
	f.unwritten, f.unsynced = false, false
	return nil
}

// WriteRollback puts the record in place: a killed daemon's next start finds it (crash).
// failWrite fails the next call.
func (f *fakeFiles) WriteRollback() error {
	if err := f.failWrite; err != nil {
		f.failWrite = nil
		return err
	}
	if f.unwritten {
		f.unwritten, f.unsynced = false, true
	}
	return nil
}

func (f *fakeFiles) SyncRollback() error {
	f.unsynced = false
	f.syncs++
	return nil
}

// crash drops what a killed daemon had not written: an unwritten rollback record.
func (f *fakeFiles) crash() {
	if f.unwritten {
		f.head, f.headMeta, f.unwritten = f.diskHead, f.diskMeta, false
	}
}

func newFakeFiles() *fakeFiles { return &fakeFiles{meta: map[string][]byte{}} }

func (f *fakeFiles) Checkpoints() []string          { return slices.Clone(f.ids) }
func (f *fakeFiles) Meta(id string) ([]byte, error) { return f.meta[id], nil }
func (f *fakeFiles) Head() string                   { return f.head }
func (f *fakeFiles) HeadMeta() []byte               { return f.headMeta }
func (f *fakeFiles) Prepare(_ context.Context, req overlay.CaptureRequest) (pendingFiles, error) {
	f.unwritten = false // the store writes the record before the capture's
	f.levels = append(f.levels, req.Level)
	return &fakePending{f: f, id: req.ID}, nil
}
func (f *fakeFiles) Rollback(_ context.Context, req overlay.RollbackRequest) (*overlay.RollbackResult, error) {
	var damage *overlay.DamageError
	if err := f.failRoll; errors.As(err, &damage) { // found while planning: nothing written
		f.failRoll = nil
		return nil, err
	}
	if req.BeforeWrite != nil {
		if err := req.BeforeWrite(); err != nil {
			return nil, err
		}
	}
	if err := f.failRoll; err != nil {
		f.failRoll = nil
		return nil, err
	}
	i := slices.Index(f.ids, req.Target)
	if i < 0 {
		return nil, fmt.Errorf("checkpoint %s: %w", req.Target, errdefs.ErrNotFound)
	}
	if req.Deferred && !f.unwritten {
		f.diskHead, f.diskMeta = f.head, f.headMeta
	}
	f.unwritten = req.Deferred
	f.head, f.headMeta, f.files = req.Target, req.Meta, req.Target
	f.rollbacks++
	return &overlay.RollbackResult{FilesRestored: 1}, nil
}
func (f *fakeFiles) PrepareRollback(_ context.Context, req overlay.RollbackRequest) (preparedFiles, error) {
	f.prepared++
	if f.onPrepare != nil {
		f.onPrepare()
	}
	return &fakePrepared{f: f, req: req}, nil
}

// fakePrepared is a prepared rollback of fakeFiles: applied, it is fakeFiles.Rollback.
type fakePrepared struct {
	f    *fakeFiles
	req  overlay.RollbackRequest
	done bool
}

func (p *fakePrepared) Rollback(ctx context.Context, open overlay.OpenFiles, beforeWrite func() error) (*overlay.RollbackResult, error) {
	if p.done {
		return nil, fmt.Errorf("prepared rollback applied twice: %w", errdefs.ErrFailedPrecondition)
	}
	p.done = true
	if p.f.onApply != nil {
		p.f.onApply()
	}
	p.req.Open, p.req.BeforeWrite = open, beforeWrite
	return p.f.Rollback(ctx, p.req)
}

func (p *fakePrepared) Abort() {
	if !p.done {
		p.done = true
		p.f.aborted++
	}
}

func (f *fakeFiles) Delete(_ context.Context, id string, merge ...overlay.MetaMerge) error {
	f.unwritten = false
	for _, kid := range f.ids {
		var r ckptRecord
		_ = json.Unmarshal(f.meta[kid], &r)
		if r.Parent == id && len(merge) > 0 {
			m, err := merge[0](f.meta[id], f.meta[kid])
			if err != nil {
				return err
			}
			f.meta[kid] = m
		}
	}
	if f.head == id {
		var r ckptRecord
		_ = json.Unmarshal(f.meta[id], &r)
		f.head, f.headMeta = r.Parent, nil
	}
	f.ids = slices.DeleteFunc(f.ids, func(x string) bool { return x == id })
	f.deleted = append(f.deleted, id)
	return nil
}
func (f *fakeFiles) Entries(id string) int { return f.entries[id] }

// PrepareFold returns a fold that deletes ids, in order, when committed.
func (f *fakeFiles) PrepareFold(ctx context.Context, ids []string, merge overlay.MetaMerge) (preparedFold, error) {
	f.foldMu.Lock()
	f.folds = append(f.folds, slices.Clone(ids))
	f.foldMu.Unlock()
	if f.onFold != nil {
		f.onFold()
	}
	return &fakeFold{f: f, ids: slices.Clone(ids), merge: merge}, nil
}

// PrepareCompact returns a compaction that changes nothing when committed.
func (f *fakeFiles) PrepareCompact(ctx context.Context, id string) (preparedFold, error) {
	f.foldMu.Lock()
	f.compacts = append(f.compacts, id)
	f.foldMu.Unlock()
	return &fakeFold{f: f}, nil
}

// fakeFold is fakeFiles' prepared fold.
type fakeFold struct {
	f     *fakeFiles
	ids   []string
	merge overlay.MetaMerge
	done  bool
}

func (p *fakeFold) Commit(ctx context.Context) error {
	if p.f.refuseFolds.Load() {
		return fmt.Errorf("fold %v refused: %w", p.ids, errdefs.ErrFailedPrecondition)
	}
	for _, id := range p.ids {
		if !slices.Contains(p.f.ids, id) || id == p.f.head {
			return fmt.Errorf("fold %s: %w", id, errdefs.ErrFailedPrecondition)
		}
	}
	for _, id := range p.ids {
		if err := p.f.Delete(ctx, id, p.merge); err != nil {
			return err
		}
	}
	p.done = true
	return nil
}
func (p *fakeFold) Finish() error { return nil }
func (p *fakeFold) Abort()        {}

func (f *fakeFiles) Diff(context.Context, string, string) ([]overlay.DiffEntry, error) {
	return nil, nil
}
func (f *fakeFiles) Export(context.Context, string, io.Writer) error { return nil }
func (f *fakeFiles) WriteLower(context.Context, string, overlay.LowerRequest) (*overlay.LowerResult, error) {
	return &overlay.LowerResult{}, nil
}
func (f *fakeFiles) LowerSize(string) (int64, error) { return 0, nil }
func (f *fakeFiles) RestoreInto(context.Context, string, overlay.RollbackRequest) (*overlay.RollbackResult, error) {
	return nil, errdefs.ErrNotImplemented
}
func (f *fakeFiles) ReadFile(context.Context, string, string, io.Writer) (overlay.FileInfo, error) {
	return overlay.FileInfo{}, errdefs.ErrNotImplemented
}
func (f *fakeFiles) Verify(context.Context, string, string, ...overlay.VerifyOption) ([]overlay.Mismatch, error) {
	return nil, nil
}
func (f *fakeFiles) Scrub(context.Context) ([]overlay.Damage, error) { return nil, nil }
func (f *fakeFiles) Close() error                                    { return nil }

type fakePending struct {
	f  *fakeFiles
	id string
}

func (p *fakePending) Changed() (int, int64) { return 0, 0 }
func (p *fakePending) Abort()                {}
func (p *fakePending) Commit(meta []byte) (*overlay.CaptureResult, error) {
	p.f.ids = append(p.f.ids, p.id)
	p.f.meta[p.id] = meta
	p.f.files, p.f.head, p.f.headMeta = p.id, p.id, nil
	return &overlay.CaptureResult{ID: p.id}, nil
}

// fakeState keeps a history of seq numbers (no document) with a compaction base; a patch
// or rollback marker takes the next seq, like state.Store.
type fakeState struct {
	base    uint64
	hist    []uint64 // points after base
	next    uint64
	doc     string
	failRB  error
	patches int
}

func (s *fakeState) Seq() uint64 {
	if len(s.hist) == 0 {
		return s.base
	}
	return s.hist[len(s.hist)-1]
}
func (s *fakeState) Get(string) (json.RawMessage, error) { return json.Marshal(s.doc) }
func (s *fakeState) Patch(_ context.Context, ops []state.Op, _ state.PatchOptions) (state.PatchResult, error) {
	s.next++
	s.hist = append(s.hist, s.next)
	s.patches++
	if len(ops) == 1 && ops[0].Path == "" {
		_ = json.Unmarshal(ops[0].Value, &s.doc)
	}
	return state.PatchResult{Seq: s.next, Applied: len(ops)}, nil
}
func (s *fakeState) RollbackTo(_ context.Context, seq uint64) (int, error) {
	if err := s.failRB; err != nil {
		s.failRB = nil
		return 0, err
	}
	if seq < s.base {
		return 0, fmt.Errorf("rollback to %d: the log was compacted up to %d: %w", seq, s.base, errdefs.ErrFailedPrecondition)
	}
	if seq == s.Seq() {
		return 0, nil
	}
	i := slices.Index(s.hist, seq) + 1
	n := len(s.hist) - i
	s.next++
	s.hist = append(s.hist[:i], s.next)
	return n, nil
}
func (s *fakeState) Has(seq uint64) bool {
	return seq == s.base || (seq > s.base && slices.Contains(s.hist, seq))
}
func (s *fakeState) Log(from, to uint64) ([]state.Entry, error) {
	if from < s.base {
		return nil, fmt.Errorf("log from %d: compacted up to %d: %w", from, s.base, errdefs.ErrFailedPrecondition)
	}
	return nil, nil
}
func (s *fakeState) Compact(_ context.Context, keep uint64) error {
	if keep < s.base {
		return fmt.Errorf("compact to %d: already compacted to %d: %w", keep, s.base, errdefs.ErrFailedPrecondition)
	}
	i := 0
	for i < len(s.hist) && s.hist[i] <= keep {
		i++
	}
	s.base, s.hist = keep, s.hist[i:]
	return nil
}
func (s *fakeState) Verify(context.Context) error { return nil }
func (s *fakeState) Close() error                 { return nil }

// fakeEffects is a journal of effects with seqs; sent counts deliveries by effect seq.
type fakeEffects struct {
	mu       sync.Mutex
	effects  []api.Effect
	sent     map[uint64]int
	ckpt     string
	onCommit func(upto uint64) error // runs before sending
	forgot   []string
}

func newFakeEffects() *fakeEffects { return &fakeEffects{sent: map[uint64]int{}} }

func (e *fakeEffects) hold() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.effects = append(e.effects, api.Effect{Seq: uint64(len(e.effects) + 1), Status: "held", Checkpoint: e.ckpt})
}
func (e *fakeEffects) SetCheckpoint(_ context.Context, _, ckpt string) error {
	e.mu.Lock()
	e.ckpt = ckpt
	e.mu.Unlock()
	return nil
}
func (e *fakeEffects) Watermark(string) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return uint64(len(e.effects))
}
func (e *fakeEffects) Rollback(_ context.Context, _ string, wm uint64) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for i := range e.effects {
		if e.effects[i].Seq > wm && e.effects[i].Status == "held" {
			e.effects[i].Status = "dropped"
			n++
		}
	}
	return n, nil
}
func (e *fakeEffects) Commit(_ context.Context, _ string, upto uint64) (int, int, error) {
	if e.onCommit != nil {
		if err := e.onCommit(upto); err != nil {
			return 0, 0, err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for i := range e.effects {
		if x := &e.effects[i]; x.Seq <= upto && x.Status == "held" {
			x.Status = "released"
			e.sent[x.Seq]++
			n++
		}
	}
	return n, 0, nil
}
func (e *fakeEffects) List(_ context.Context, _ string, from, to uint64) ([]api.Effect, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []api.Effect
	for _, x := range e.effects {
		if x.Seq > from && (to == 0 || x.Seq <= to) {
			out = append(out, x)
		}
	}
	return out, nil
}
func (e *fakeEffects) Forget(_ context.Context, sandbox string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgot = append(e.forgot, sandbox)
	return nil
}

func (e *fakeEffects) status(seq uint64) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.effects[seq-1].Status
}

// rig is an orchestrator with one session on fakes.
type rig struct {
	t   *testing.T
	o   *Orchestrator
	s   *session
	dir string
	frz *fakeFreezer
	fs  *fakeFiles
	st  *fakeState
	fx  *fakeEffects
	ss  stateStore // when set, the session's state instead of st (a real state.Store)
}

func newRig(t *testing.T, retain int) *rig { return newRigWith(t, retain, nil) }

// newRigWith is newRig with the session's state in ss (nil: a fakeState).
func newRigWith(t *testing.T, retain int, ss stateStore) *rig {
	t.Helper()
	r := &rig{t: t, dir: t.TempDir(), frz: &fakeFreezer{}, fs: newFakeFiles(), st: &fakeState{}, fx: newFakeEffects(), ss: ss}
	r.o = &Orchestrator{opts: Options{Retain: retain}, effects: r.fx, sessions: map[string]*session{}}
	r.reopen()
	if _, err := r.o.checkpoint(context.Background(), r.s, api.CheckpointRequest{Message: "lease"}); err != nil {
		t.Fatal(err)
	}
	if err := r.s.saveBaseState(); err != nil {
		t.Fatal(err)
	}
	return r
}

// reopen opens the session again on the same fakes and directory, as a restarted daemon
// does (recover included).
func (r *rig) reopen() {
	r.t.Helper()
	if r.s != nil {
		r.s.bg.Wait()
		_ = r.s.intents.close()
	}
	r.fs.crash()
	var st stateStore = r.st
	if r.ss != nil {
		st = r.ss
	}
	s := &session{id: "sb", dir: r.dir, rec: records{dir: r.dir}, frz: r.frz, fs: r.fs, state: st, ready: make(chan struct{}),
		openRoot: func() (*os.File, error) { return os.Open(r.dir) }}
	var err error
	if s.meta, err = s.rec.readMeta(); err != nil {
		r.t.Fatal(err)
	}
	if s.intents, err = openIntents(r.dir); err != nil {
		r.t.Fatal(err)
	}
	if err := s.loadCheckpoints(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	if err := r.o.recover(context.Background(), s); err != nil {
		r.t.Fatal(err)
	}
	close(s.ready)
	r.o.sessions["sb"] = s
	r.s = s
	r.t.Cleanup(func() { s.bg.Wait(); _ = s.intents.close() })
}

func (r *rig) checkpoint() string {
	r.t.Helper()
	c, err := r.o.Checkpoint(context.Background(), "sb", api.CheckpointRequest{})
	if err != nil {
		r.t.Fatal(err)
	}
	return c.ID
}

func (r *rig) patch() {
	r.t.Helper()
	if _, err := r.o.StatePatch(context.Background(), "sb", []state.Op{{Op: state.OpAdd, Path: "/x", Value: json.RawMessage("1")}}, nil); err != nil {
		r.t.Fatal(err)
	}
}
