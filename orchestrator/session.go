package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/criu/proctpl"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/state"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// session is the checkpoint side of one leased sandbox: its layer store, agent state, effect
// watermarks and checkpoint records, all under <root>/sandboxes/<id>/.
type session struct {
	// mu serialises checkpoints, rollbacks and a commit's cut (write lock); state patches
	// take the read lock so that they run concurrently with each other but never across a
	// cut. A commit sends its effects without it: the commit point already protects the cut.
	mu       sync.RWMutex
	commitMu sync.Mutex // one commit at a time; taken before mu
	id       string
	sb       pool.Sandbox
	dir      string
	fs       fileStore
	state    stateStore
	rec      records
	meta     sessionMeta
	ckpts    []ckptRecord // oldest first: a tree by their Parent links
	head     string       // the checkpoint the sandbox is at (tree.go)
	headSeq  uint64       // the state seq at which the document is the head's
	// inherited are the checkpoints a restored sandbox's snapshot carried (listed, not
	// rollback targets); see snapshot_history.go.
	inherited []api.Checkpoint
	dumped    bool // its processes were dumped at L3 (so it is not reused after release)
	frz       freezer
	intents   *intentLog
	steps     *stepLog                 // the step record (steps.go)
	pending   *rollbackIntent          // a rollback that failed after it began; finished before anything else
	openRoot  func() (*os.File, error) // the sandbox's root (default sb.OpenRoot; fakes in tests)
	// tpls are the process templates of checkpoints taken with processes, by checkpoint ID
	// and the host pid of the process they copy (processes.go). They live as long as the
	// daemon at most.
	tpls       map[string]map[int]*proctpl.Template
	tplDropped map[string]string // why a checkpoint's templates were dropped (tplbounds.go)
	tplUsed    map[string]uint64 // when (tplClock) each checkpoint's templates were last used
	tplClock   uint64            // counts the uses of templates (tplUsed)
	tplCount   atomic.Int64      // templates in tpls, for the node's metrics and bound
	spares     string            // the checkpoint whose templates keep spare copies (preforkLater)
	// unsynced is an answered rollback whose record is in place but not yet durable, and
	// whose intent is still recorded (syncRollback).
	unsynced *rollbackIntent
	// headRollback is the rollback intent ID in the head record read at start (loadHead).
	headRollback string
	bg           sync.WaitGroup // background steps of operations (afterRollback, preforkLater)
	bgMu         sync.Mutex     // held by the running background step (background)
	closedInit   sync.Once      // makes closed (closing)
	closeOnce    sync.Once      // closes closed (close)
	closed       chan struct{}  // closed by close: background steps waiting for an answer start
	folding      bool           // retention's folder runs (retain.go)
	toCompact    string         // an automatic L2 cut as a delta, for the folder to make full
	compactTries int            // compactions of it the tree overtook
	foldTries    int            // folds in a row the tree overtook (retain.go: maxOvertaken)
	ended        bool           // released: the folder installs nothing more
	started      map[int]bool   // the rollback's copies started in its frozen window, by entry pid
	hugeSeen     map[int]bool   // pids that had their chance at huge pages (hugepages.go)
	intentSynced func() error   // waits for the running rollback's intent to be durable
	frozenProcs  *pool.Pinned   // while frozen by freeze: the processes listed meanwhile
	tplBytes     atomic.Int64   // their memory, as last measured
	asyncErr     error          // the failure of the last asynchronous checkpoint (async.go)

	// forkLayers are the shared fork layers written from this sandbox's checkpoints, by
	// checkpoint ID (forkfrom.go): a later fork of the same checkpoint reuses one while a
	// fork still uses it.
	forkLayersMu sync.Mutex
	forkLayers   map[string]string

	ready     chan struct{} // closed once open finished
	openErr   error
	stopServe func() // closes the sandbox's own API socket
}

func (o *Orchestrator) sessionDir(id string) string {
	return filepath.Join(o.opts.Root, "sandboxes", id)
}

// startSession opens (or reopens, after a restart) the session of a leased sandbox in the
// background; users of the session wait for it. A fresh session's first checkpoint captures
// the sandbox as leased.
func (o *Orchestrator) startSession(ctx context.Context, sb pool.Sandbox) *session {
	return o.startSessionWith(ctx, sb, nil)
}

// startSessionWith is startSession for a restored sandbox, whose session starts from seed
// (agent state, first checkpoint ID, inherited history).
func (o *Orchestrator) startSessionWith(ctx context.Context, sb pool.Sandbox, seed *sessionSeed) *session {
	s := &session{id: sb.ID, sb: sb, dir: o.sessionDir(sb.ID), rec: records{dir: o.sessionDir(sb.ID)}, steps: newStepLog(o.sessionDir(sb.ID)),
		frz: pool.NewFreezer(sb.Layout.Cgroup), ready: make(chan struct{})}
	o.mu.Lock()
	o.sessions[sb.ID] = s
	o.mu.Unlock()
	go func() {
		defer close(s.ready)
		ctx := log.With(context.WithoutCancel(ctx), "sandbox", sb.ID)
		if s.openErr = o.openSession(ctx, s, seed); s.openErr != nil {
			log.L(ctx).Error("open sandbox session", "error", s.openErr)
		}
	}()
	return s
}

func (o *Orchestrator) openSession(ctx context.Context, s *session, seed *sessionSeed) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("create session dir: %w", err)
	}
	if err := s.writeClaim(); err != nil {
		return err
	}
	if err := o.registerEgress(ctx, s.sb); err != nil {
		return fmt.Errorf("register with the egress proxy: %w", err)
	}
	if err := o.openStores(ctx, s); err != nil {
		return err
	}
	// A crash may have left the sandbox frozen, in the middle of a rollback: finish it
	// before the sandbox runs again.
	if err := o.recover(ctx, s); err != nil {
		return err
	}
	if l := s.latest(); l != nil { // resumed after a restart: effects carry its tag again
		if err := o.effects.SetCheckpoint(ctx, s.id, l.ID); err != nil {
			return fmt.Errorf("tag effects with checkpoint %s: %w", l.ID, err)
		}
		var wm uint64 // the journal holds at least what the newest checkpoint saw
		for _, c := range s.ckpts {
			wm = max(wm, c.EffectsWatermark)
		}
		o.expectEffects(ctx, s.id, wm)
	}
	if err := s.loadInherited(); err != nil {
		return err
	}
	if len(s.ckpts) == 0 {
		if err := s.seedState(ctx, seed.doc()); err != nil {
			return err
		}
		msg := "lease"
		if seed != nil {
			if err := s.applySeed(seed); err != nil {
				return err
			}
			msg = seed.message
		}
		if _, err := o.checkpoint(ctx, s, api.CheckpointRequest{Level: api.LevelL1, Message: msg}); err != nil {
			return err
		}
		if err := s.saveBaseState(); err != nil {
			return err
		}
	}
	o.resumeProcs(ctx, s) // after a restart: the detached execs it had
	var err error
	s.stopServe, err = o.serveSelf(ctx, s)
	return err
}

// openStores opens the session's layer store, agent state, records and intent file.
func (o *Orchestrator) openStores(ctx context.Context, s *session) error {
	var opts []overlay.Option
	if o.opts.WalkUpperDirs {
		opts = append(opts, overlay.WithoutTracking())
	}
	if m := s.sb.Isolation.IDMapping; m != nil { // the image shows through idmapped mounts
		opts = append(opts, overlay.WithLowerIDs(m.HostID, m.Size))
	}
	if l := s.sb.Layout.Folded; l != "" { // a fork's shared layer: part of its files
		opts = append(opts, overlay.WithFoldedLower(l))
	}
	fs, err := overlay.NewStore(filepath.Join(s.dir, "layers"), opts...)
	if err != nil {
		return err
	}
	s.fs = overlayFiles{fs}
	if s.state, err = state.Open(ctx, filepath.Join(s.dir, "state")); err != nil {
		return err
	}
	if s.meta, err = s.rec.readMeta(); err != nil {
		return fmt.Errorf("read session meta: %w", err)
	}
	if s.intents, err = openIntents(s.dir); err != nil {
		return err
	}
	return s.loadCheckpoints(ctx)
}

// loadCheckpoints reads the checkpoint records, which live in the layer store's packs (a
// checkpoint and its record are made durable together); record files of older versions are
// still read. A layer checkpoint without a record is dropped.
func (s *session) loadCheckpoints(ctx context.Context) error {
	recs, err := s.rec.list()
	if err != nil {
		return err
	}
	legacy := map[string]ckptRecord{}
	for _, r := range recs {
		legacy[r.ID] = r
	}
	layers := s.fs.Checkpoints()
	for _, id := range layers {
		meta, err := s.fs.Meta(id)
		if err != nil {
			return err
		}
		if len(meta) > 0 {
			var r ckptRecord
			if err := json.Unmarshal(meta, &r); err != nil {
				return fmt.Errorf("record of checkpoint %s: %v: %w", id, err, errdefs.ErrDataLoss)
			}
			s.ckpts = append(s.ckpts, r)
		} else if r, ok := legacy[id]; ok {
			s.ckpts = append(s.ckpts, r)
		}
	}
	for _, r := range recs {
		if !slices.Contains(layers, r.ID) {
			if err := s.rec.remove(r.ID); err != nil {
				return err
			}
		}
	}
	for _, r := range s.ckpts {
		s.meta.Next = max(s.meta.Next, ckptNum(r.ID)+1)
	}
	for i := len(layers) - 1; i >= 0; i-- {
		if s.find(layers[i]) < 0 {
			log.L(ctx).Warn("dropping checkpoint without a record (crash during checkpoint)", "checkpoint", layers[i])
			if err := s.fs.Delete(ctx, layers[i]); err != nil {
				return err
			}
		}
	}
	return s.loadHead()
}

// loadHead finds the head: the layer store's (the latest capture or the target of the latest
// rollback), with the state seq the rollback recorded for it.
func (s *session) loadHead() error {
	s.head = s.fs.Head()
	i := s.find(s.head)
	if i < 0 {
		s.head = ""
		return nil
	}
	s.headSeq = s.ckpts[i].StateSeq
	if m := s.fs.HeadMeta(); len(m) > 0 {
		var h headRecord
		if err := json.Unmarshal(m, &h); err != nil {
			return fmt.Errorf("head record: %v: %w", err, errdefs.ErrDataLoss)
		}
		s.headSeq, s.headRollback = h.StateSeq, h.Rollback
	}
	return nil
}

// find returns the index of checkpoint id, or -1.
func (s *session) find(id string) int {
	for i, c := range s.ckpts {
		if c.ID == id {
			return i
		}
	}
	return -1
}

// latest returns the head's record (nil before the first checkpoint).
func (s *session) latest() *ckptRecord {
	i := s.find(s.head)
	if i < 0 {
		return nil
	}
	return &s.ckpts[i]
}

// closing returns the channel close closes.
func (s *session) closing() <-chan struct{} {
	s.closedInit.Do(func() { s.closed = make(chan struct{}) })
	return s.closed
}

func (s *session) close() error {
	s.closing()
	s.closeOnce.Do(func() { close(s.closed) }) // closing made it
	s.bg.Wait()                                // a rollback's record is synced before its files close
	if s.stopServe != nil {
		s.stopServe()
	}
	var errs []error
	if s.fs != nil {
		errs = append(errs, s.fs.Close())
	}
	if s.state != nil {
		errs = append(errs, s.state.Close())
	}
	errs = append(errs, s.intents.close())
	return errors.Join(errs...)
}

// session returns the open session of a leased sandbox.
func (o *Orchestrator) session(ctx context.Context, id string) (*session, error) {
	o.mu.Lock()
	s, ok := o.sessions[id]
	o.mu.Unlock()
	if !ok {
		if err := o.quarantinedError(id); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.openErr != nil {
		return nil, fmt.Errorf("sandbox %q is not usable: %w", id, s.openErr)
	}
	if err := s.sb.Usable(); err != nil { // fenced: its init exited
		return nil, err
	}
	return s, nil
}

// endSession closes a released sandbox's session and deletes its directory.
func (o *Orchestrator) endSession(ctx context.Context, id string) {
	o.mu.Lock()
	s, ok := o.sessions[id]
	delete(o.sessions, id)
	o.mu.Unlock()
	o.procs.forget(id)
	if !ok {
		return
	}
	<-s.ready
	s.mu.Lock()
	s.ended = true
	s.releaseTemplates("")
	s.mu.Unlock()
	if err := s.close(); err != nil {
		log.L(ctx).Warn("close session", "sandbox", id, "error", err)
	}
	if err := o.effects.Forget(ctx, id); err != nil {
		log.L(ctx).Warn("remove effect journal", "sandbox", id, "error", err)
	}
	if err := os.RemoveAll(s.dir); err != nil {
		log.L(ctx).Warn("remove session dir", "sandbox", id, "error", err)
	}
}

// seedState makes a fresh session's state document doc (a restored sandbox's).
func (s *session) seedState(ctx context.Context, doc json.RawMessage) error {
	if len(doc) == 0 || s.state.Seq() != 0 {
		return nil
	}
	_, err := s.state.Patch(ctx, []state.Op{{Op: state.OpReplace, Path: "", Value: doc}}, state.PatchOptions{})
	if err != nil {
		return fmt.Errorf("restore agent state: %w", err)
	}
	return nil
}

// pin lists the sandbox's processes (but the templates) in the background, each held by a
// pidfd (pool.Pin), for freeze: a list taken before the window, brought up to date in it.
// Run it before the freeze, so that it overlaps the freeze (and whatever comes first).
func (s *session) pin() <-chan *pool.Pinned {
	ch := make(chan *pool.Pinned, 1)
	skip := s.templatePids()
	go func() { ch <- s.frz.Pin(skip) }()
	return ch
}

// freeze freezes the sandbox. pinned, from pin, gives its processes listed meanwhile: in the
// frozen window sandboxProcs then only brings that list up to date and kill signals through
// its pidfds. The thaw (Orchestrator.thaw) drops it.
func (s *session) freeze(ctx context.Context, pinned <-chan *pool.Pinned) error {
	s.unpin()
	err := s.frz.Freeze(ctx)
	p := <-pinned
	if err != nil {
		p.Close()
		return err
	}
	s.frozenProcs = p
	return nil
}

// kill SIGKILLs those of pids that are members of the sandbox, through pidfds (never by
// number): in a window of freeze, those of its list (Pinned.Kill: no membership read).
func (s *session) kill(pids []int) int {
	if s.frozenProcs != nil {
		return s.frozenProcs.Kill(pids)
	}
	return s.frz.Kill(pids)
}

// unpin drops the list freeze took.
func (s *session) unpin() {
	s.frozenProcs.Close()
	s.frozenProcs = nil
}

// background runs fn once the caller has released the session lock (after the answer), on
// a goroutine the session's close waits for (bg), with ctx's values but not its
// cancellation. fn holds the lock shared, and bgMu: the operations that change the sandbox
// (checkpoint, rollback, commit, release: the exclusive holders) wait for it, while the
// readers (exec, state, listings) go on; an exec right after a rollback with processes
// would otherwise wait for the spare copies' forks (~1-2 ms for 50 MB of heap). So fn
// touches only what no reader writes (unsynced, spares, the templates' spares), and one
// background step runs at a time.
//
// Under an API request (withAnswerGate) fn starts only once the answer is on the wire: a
// rollback's spare copies are forks of 50 MB of heap, and on a small host they would take
// the cores the answer's last steps and the caller's wake-up need (0-0.25 ms of a rollback
// with processes in paired runs, docs/benchmarks.md, session 22). A close of the session
// meanwhile (a release in the same request) opens the gate: close waits for fn, and nothing
// else does.
func (s *session) background(ctx context.Context, fn func(context.Context)) {
	answered := answerGate(ctx)
	ctx = context.WithoutCancel(ctx)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		if answered != nil {
			select {
			case <-answered:
			case <-s.closing():
			}
		}
		s.mu.RLock()
		defer s.mu.RUnlock()
		s.bgMu.Lock()
		defer s.bgMu.Unlock()
		fn(ctx)
	}()
}
