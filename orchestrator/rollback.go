package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// Rollback returns a sandbox's files, agent state and held effects to a checkpoint, in place:
// record the rollback intent, freeze, stop the processes started since, drop the effects,
// restore files through the merged mount, undo the state ops, thaw, then write the file
// store's record of the new head and clear the intent (see settle). A rollback that fails
// after its intent was recorded stays pending: it is finished before the sandbox's next
// checkpoint operation (or at start, after a crash).
func (o *Orchestrator) Rollback(ctx context.Context, id string, req api.RollbackRequest) (api.RollbackResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.RollbackResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := o.finishPending(ctx, s); err != nil {
		return api.RollbackResult{}, err
	}
	start := time.Now()
	in, err := s.rollbackTarget(req)
	if err != nil {
		return api.RollbackResult{}, err
	}
	res := api.RollbackResult{ID: id, To: in.Target, From: in.From}
	if o.proxy != nil { // before the sandbox runs again: its next requests replay (or not)
		o.proxy.SetReplay(id, req.Replay)
	}
	frozen, err := o.undo(ctx, s, in, &res, true)
	if err != nil {
		return res, fmt.Errorf("rollback sandbox %q to %s: %w", id, in.Target, err)
	}
	res.FrozenMS, res.TotalMS = ms(frozen), ms(time.Since(start))
	log.L(ctx).Info("sandbox rolled back", "sandbox", id, "checkpoint", in.Target, "files", res.FilesRestored,
		"ops", res.OpsUndone, "effects", res.EffectsDropped, "processes", res.ProcessesStopped,
		"frozen_ms", res.FrozenMS, "total_ms", res.TotalMS)
	return res, nil
}

// rollbackTarget validates a rollback request and returns its intent. The target may be
// any checkpoint of the tree; the commit rule holds: the commit point must be a strict
// ancestor of the target, unless forced.
func (s *session) rollbackTarget(req api.RollbackRequest) (rollbackIntent, error) {
	to := req.To
	if to == "" {
		to = refHead
	}
	i, err := s.resolve(to)
	if err != nil {
		return rollbackIntent{}, err
	}
	t := s.ckpts[i]
	if s.behindCommit(t.ID) && !req.Force {
		return rollbackIntent{}, fmt.Errorf("checkpoint %s of sandbox %q is not after the last commit (checkpoint %s), whose effects were sent; take a new checkpoint, or use --force to roll back files and state anyway: %w",
			t.ID, s.id, s.meta.CommitAfter, errdefs.ErrFailedPrecondition)
	}
	_, lca, _ := s.pathBetween(s.head, t.ID)
	l := s.find(lca)
	if l < 0 {
		return rollbackIntent{}, fmt.Errorf("checkpoint %s has no common ancestor with the head %s: %w", t.ID, s.head, errdefs.ErrDataLoss)
	}
	in := rollbackIntent{ID: nonce(), Target: t.ID, Watermark: s.ckpts[l].EffectsWatermark, StateSeq: t.StateSeq,
		StateFrom: s.state.Seq(), From: s.head, FromSeq: s.headSeq}
	switch {
	case s.state.Has(t.StateSeq): // its document is a point of the log: undo to it
	case i == 0 && s.hasBaseState(t.StateSeq):
		in.StateBase = true
	default:
		if err := s.canRebuild(in); err != nil {
			return rollbackIntent{}, fmt.Errorf("agent state of checkpoint %s is no longer available: %w", t.ID, err)
		}
		in.Rebuild = true
	}
	return in, nil
}

// undo runs the frozen part of a rollback and returns how long the sandbox was frozen. A new
// rollback (record) writes its intent before anything changes; a redo finds it on disk.
// Every step after it is idempotent, so that a redo can run them again.
func (o *Orchestrator) undo(ctx context.Context, s *session, in rollbackIntent, res *api.RollbackResult, record bool) (time.Duration, error) {
	began := time.Now()
	pinned := s.pin() // beside the intent's write, the files' preparation and the freeze
	if record {
		// Written before the freeze (the session lock keeps the state and checkpoints
		// still, and whatever the sandbox does until the freeze is after the target, undone
		// by a redo as by the rollback); its fdatasync runs meanwhile, in parallel with the
		// files' planning, the freeze and the window's listing of the processes and their
		// open files, and the first change waits for it (BeforeWrite): nothing changes
		// before the intent is durable. In the page cache it already survives a killed
		// daemon.
		if err := failpoint.Inject("rollback/before-intent"); err != nil {
			(<-pinned).Close()
			return 0, err
		}
		synced, err := s.intents.writeAsync(in)
		if err != nil {
			(<-pinned).Close()
			return 0, err // nothing changed
		}
		s.intentSynced = synced
		defer func() { _ = synced(); s.intentSynced = nil }() // never left running
	}
	prepAt := time.Now()
	prep := o.prepareFiles(ctx, s, in)
	if prep != nil {
		defer prep.Abort() // a no-op once applied
	}
	// The freeze does not wait for the intent's sync: its device flush (0.5-1 ms here) would
	// add to every rollback's answer, and the freeze plus the window's listing before its
	// first change (BeforeWrite) take about as long, so the window rarely waits for it.
	freezeAt := time.Now()
	if err := s.freeze(ctx, pinned); err != nil {
		if record {
			_ = s.intents.clear() // nothing changed
		}
		return 0, err
	}
	frozenAt := time.Now()
	var sp applySpans // logged after the thaw: nothing is written to the log in the window
	defer sp.log(ctx, s.id)
	defer o.thaw(ctx, s)
	if err := failpoint.Inject("rollback/frozen"); err != nil {
		s.pending = &in
		return 0, err
	}
	err := o.applyRollback(ctx, s, in, prep, res, &sp)
	if record && errors.Is(err, errNothingChanged) { // refused before any step: not pending
		if cerr := s.intents.clear(); cerr == nil {
			s.pending = nil
			return 0, err
		}
	}
	if err != nil {
		s.pending = &in
		return 0, pendingError(err)
	}
	target := s.ckpts[s.find(in.Target)]
	if target.Level == api.LevelL3 {
		if err := o.settle(s, in); err != nil {
			return 0, err
		}
		err := o.restoreProcesses(ctx, s, target)
		if err == nil && target.ProcCkpt != nil { // a checkpoint with processes kept by CRIU
			res.ProcessesRestored = len(target.ProcCkpt.Procs)
		}
		return time.Since(frozenAt), err
	}
	applied := time.Now()
	if record && target.ProcCkpt != nil {
		spans := []any{"intent", prepAt.Sub(began), "prepare", freezeAt.Sub(prepAt), "freeze", frozenAt.Sub(freezeAt)}
		return o.thawBesideRecord(ctx, s, in, target, res, frozenAt, applied, spans)
	}
	if err := o.thaw(ctx, s); err != nil {
		s.pending = &in
		return 0, pendingError(err)
	}
	thawed := time.Now()
	// With processes, the window ends when the copies run: until then the sandbox's own
	// processes are gone.
	err = o.restoreProcessCheckpoint(ctx, s, target, res)
	frozen, copied := time.Since(frozenAt), time.Now()
	settle := o.settle
	if record { // answered before the record's syncs (settleAnswered)
		settle = o.settleAnswered
	}
	if serr := settle(s, in); serr != nil {
		return 0, serr
	}
	log.L(ctx).Debug("rollback phases", "sandbox", s.id, "checkpoint", in.Target, "intent", prepAt.Sub(began),
		"prepare", freezeAt.Sub(prepAt), "freeze", frozenAt.Sub(freezeAt),
		"apply", applied.Sub(frozenAt), "thaw", thawed.Sub(applied), "copies", copied.Sub(thawed), "record", time.Since(copied))
	o.afterRollback(ctx, s, target)
	return frozen, err
}

// thawBesideRecord ends an answered rollback to a checkpoint with processes (undo, after
// applyRollback): the thaw and the start of the copies left to start run on one goroutine,
// the record's write (settleAnswered) on the caller's, which touches nothing of theirs (the
// layer store, the pending and unsynced intents). That thaw wakes the killed processes,
// which exit (the REPL's 50 MB unmapped): ~0.2 ms against a checkpoint's 0.06; the record
// takes ~0.09 (paired runs in docs/benchmarks.md, session 19). A files-only rollback's thaw
// is shorter than a goroutine's hand-off and stays in line. If the thaw fails the rollback
// stays pending, its record written: the next operation syncs it and finishes the rollback.
// The failpoint rollback/after-thaw (in settleAnswered) fires here while the thaw runs.
// spans are the debug spans from before the window.
func (o *Orchestrator) thawBesideRecord(ctx context.Context, s *session, in rollbackIntent, target ckptRecord, res *api.RollbackResult, frozenAt, applied time.Time, spans []any) (time.Duration, error) {
	type thawed struct {
		err, copyErr     error
		thawed, restored time.Time
	}
	done := make(chan thawed, 1)
	go func() {
		var t thawed
		if t.err = o.thaw(ctx, s); t.err == nil {
			t.thawed = time.Now()
			// With processes, the window ends when the copies run: until then the
			// sandbox's own processes are gone.
			t.copyErr = o.restoreProcessCheckpoint(ctx, s, target, res)
		}
		t.restored = time.Now()
		done <- t
	}()
	serr := o.settleAnswered(s, in)
	recorded := time.Now()
	t := <-done
	if t.err != nil {
		s.pending = &in
		return 0, pendingError(t.err)
	}
	if serr != nil {
		return 0, serr
	}
	log.L(ctx).Debug("rollback phases", append(append([]any{"sandbox", s.id, "checkpoint", in.Target}, spans...),
		"apply", applied.Sub(frozenAt), "thaw", t.thawed.Sub(applied), "copies", t.restored.Sub(t.thawed),
		"record", recorded.Sub(applied), "beside", true)...)
	o.afterRollback(ctx, s, target)
	return t.restored.Sub(frozenAt), t.copyErr
}

// prepareFiles works the files' rollback out before the freeze (overlay.PrepareRollback: the
// upper dir's scan and the plan, every content read and checked), while the processes are
// pinned, so that the frozen window only checks that the sandbox moved nothing the plan
// depends on (its open files included, which the window lists as before) and writes. It
// returns nil when the rollback cannot be prepared: the window then works it out, and
// reports what stops it.
func (o *Orchestrator) prepareFiles(ctx context.Context, s *session, in rollbackIntent) preparedFiles {
	if s.find(in.Target) < 0 {
		return nil
	}
	merged, closeRoot, err := s.merged()
	if err != nil {
		return nil
	}
	defer closeRoot() // the prepared rollback holds roots of its own
	prep, err := s.fs.PrepareRollback(ctx, s.filesRollback(merged, in, overlay.OpenFiles{}))
	if err != nil {
		log.L(ctx).Debug("rollback not prepared: worked out in the frozen window", "sandbox", s.id, "error", err)
		return nil
	}
	return prep
}

// rollbackFiles rolls the files back to in.Target (in the frozen window), worked out now.
func (s *session) rollbackFiles(ctx context.Context, in rollbackIntent, open overlay.OpenFiles, beforeWrite func() error) (*overlay.RollbackResult, error) {
	merged, closeRoot, err := s.merged()
	if err != nil {
		return nil, err
	}
	defer closeRoot()
	req := s.filesRollback(merged, in, open)
	req.BeforeWrite = beforeWrite
	return s.fs.Rollback(ctx, req)
}

// filesRollback is the request of a rollback's files to in.Target, through the merged root.
func (s *session) filesRollback(merged string, in rollbackIntent, open overlay.OpenFiles) overlay.RollbackRequest {
	headMeta, _ := json.Marshal(headRecord{StateSeq: in.stateSeqAfter(), Rollback: in.ID}) // cannot fail
	return overlay.RollbackRequest{Merged: merged, Upper: s.sb.Layout.Upper, Lower: s.sb.Layout.Lower,
		Target: in.Target, Open: open, Meta: headMeta,
		Deferred: true, // written by settle, after the thaw
	}
}

// settleAnswered is settle for a rollback about to be answered: the record goes in place
// (written and renamed, not synced: the page cache holds it) and the intent stays until a
// background step (afterRollback), or the sandbox's next checkpoint operation, makes the
// record durable and clears it (syncRollback). The record names the intent, so a daemon
// killed in between finds, at start, a record that says its rollback is done: it syncs
// the record and clears the intent instead of redoing the rollback, which would undo what
// the sandbox did after the answer (its files, its held effects). Only a power loss in
// those milliseconds loses the record (or cuts it: the store then ignores it), and the
// rollback is then redone at start: what the sandbox did since the answer is undone, as
// a power loss loses the sandbox's own unsynced writes. Nothing after the answer can
// commit it before: a commit, checkpoint or rollback syncs first.
func (o *Orchestrator) settleAnswered(s *session, in rollbackIntent) error {
	err := failpoint.Inject("rollback/after-thaw")
	if err == nil {
		err = s.fs.WriteRollback()
	}
	if err != nil {
		s.pending = &in
		return pendingError(err)
	}
	s.pending, s.unsynced = nil, &in
	return nil
}

// syncRollback makes an answered rollback durable (settleAnswered): its record synced, then
// its intent cleared. Callers hold s.mu, exclusive or as background does.
func (o *Orchestrator) syncRollback(s *session) error {
	if s.unsynced == nil {
		return nil
	}
	err := failpoint.Inject("rollback/before-sync")
	if err == nil {
		err = s.fs.PersistRollback()
	}
	if err == nil {
		err = failpoint.Inject("rollback/synced")
	}
	if err == nil {
		err = s.intents.clear()
	}
	if err != nil {
		return fmt.Errorf("make the rollback to %s durable: %w", s.unsynced.Target, err)
	}
	s.unsynced = nil
	return nil
}

// afterRollback runs, once the caller released the session (after the answer), what a
// rollback leaves to the background: the syncs of its record (syncRollback), then the spare
// copies of the target's templates (preforkSpares).
func (o *Orchestrator) afterRollback(ctx context.Context, s *session, target ckptRecord) {
	if s.unsynced == nil && target.ProcCkpt == nil {
		return
	}
	if s.tpls[target.ID] != nil {
		s.usedTemplates(target.ID) // the last dropped by template_checkpoints
	}
	s.background(ctx, func(ctx context.Context) {
		if err := o.syncRollback(s); err != nil {
			log.L(ctx).Error("rollback record", "sandbox", s.id, "error", err) // the next operation retries
			return
		}
		if target.ProcCkpt != nil {
			o.preforkSpares(ctx, s, target.ID)
		}
	})
}

// settle ends a rollback whose steps are done: the file store's record of the new head is
// written (durably; after the thaw, since the files' rollback defers it), then the intent is
// cleared. Until the record is durable the intent stays: a crash in between redoes the
// rollback at start, and a failure leaves it pending. The session lock is held, so nothing
// else sees the sandbox's checkpoints before the record is written.
func (o *Orchestrator) settle(s *session, in rollbackIntent) error {
	err := failpoint.Inject("rollback/after-thaw")
	if err == nil {
		err = s.fs.PersistRollback()
	}
	if err == nil {
		err = s.intents.clear()
	}
	if err != nil {
		s.pending = &in
		return pendingError(err)
	}
	s.pending = nil
	return nil
}

// pendingError says that a rollback failed after it began, and stays pending.
func pendingError(err error) error {
	return fmt.Errorf("%w (the rollback is pending: it is finished before the sandbox's next checkpoint, rollback or commit)", err)
}

// applyRollback does the steps of a recorded rollback: the processes started since the
// target are stopped, the effects after the common ancestor of head and target dropped
// (first: they may never be committed), its files and state restored, and the target made
// the head; no checkpoint is deleted. The sandbox is frozen. prep, when not nil, is the files'
// rollback prepared before the freeze.
func (o *Orchestrator) applyRollback(ctx context.Context, s *session, in rollbackIntent, prep preparedFiles, res *api.RollbackResult, sp *applySpans) error {
	i := s.find(in.Target)
	if i < 0 {
		return fmt.Errorf("checkpoint %s is gone: %w", in.Target, errdefs.ErrDataLoss)
	}
	target := s.ckpts[i]
	t0 := time.Now()
	procs, err := s.sandboxProcs() // the templates belong to checkpoints, not to the sandbox's run
	if err != nil {
		return err
	}
	armed := o.armCopies(s, target) // after the list: the copies are never in it
	done := false
	defer func() {
		if done {
			t := time.Now()
			s.started = armed.start()
			for e := range s.started {
				s.sawHuge(armed.pids[e]) // a copy shares its template's pages
			}
			if len(armed.pids) > 0 {
				sp.args = append(sp.args, "copies_armed", armed.armedAt.Sub(t), "copies_start", time.Since(t))
			}
		} else {
			armed.cancel()
		}
	}()
	t1 := time.Now()
	var tStop, tStopped time.Time
	open := overlay.WritableFiles(pids(procs))
	tOpen := time.Now()
	// Processes and effects go only once the files' rollback is known to be possible (its
	// contents opened and checked): a damaged target changes nothing (errNothingChanged).
	began := false
	beforeWrite := func() error {
		if s.intentSynced != nil {
			if err := s.intentSynced(); err != nil {
				return fmt.Errorf("sync rollback intent: %w (%w)", err, errNothingChanged)
			}
		}
		began = true
		tStop = time.Now()
		defer func() { tStopped = time.Now() }()
		return o.stopNewer(ctx, s, in, target, procs, res)
	}
	var fsRes *overlay.RollbackResult
	if prep != nil {
		fsRes, err = prep.Rollback(ctx, open, beforeWrite)
	} else {
		fsRes, err = s.rollbackFiles(ctx, in, open, beforeWrite)
	}
	t2 := time.Now()
	var damage *overlay.DamageError
	if !began && errors.As(err, &damage) {
		return fmt.Errorf("restore files: %w (%w)", err, errNothingChanged)
	}
	if err != nil {
		return fmt.Errorf("restore files: %w", err)
	}
	res.FilesRestored, sp.files = fsRes.FilesRestored, &fsRes.Phases
	if err := failpoint.Inject("rollback/after-files"); err != nil {
		return err
	}
	if res.OpsUndone, err = s.undoState(ctx, in); err != nil {
		return fmt.Errorf("files restored, but undoing agent state failed: %w", err)
	}
	t3 := time.Now()
	defer func() {
		sp.args = []any{"procs", t1.Sub(t0), "open_files", tOpen.Sub(t1), "files_plan", tStop.Sub(tOpen),
			"stop", tStopped.Sub(tStop), "files_write", t2.Sub(tStopped), "state", t3.Sub(t2), "effects", time.Since(t3)}
	}()
	if err := failpoint.Inject("rollback/after-state"); err != nil {
		return err
	}
	s.head, s.headSeq = target.ID, in.stateSeqAfter()
	if err := o.effects.SetCheckpoint(ctx, s.id, target.ID); err != nil {
		return err
	}
	if err := failpoint.Inject("rollback/before-clear"); err != nil {
		return err
	}
	done = true
	return nil
}

// applySpans are a rollback's debug spans, taken in its frozen window and logged after it.
type applySpans struct {
	args  []any                   // applyRollback's, once its steps are done
	files *overlay.RollbackPhases // the files' rollback's
}

// log writes the spans taken.
func (sp *applySpans) log(ctx context.Context, id string) {
	if sp.files != nil {
		log.L(ctx).Debug("overlay rolled back", append([]any{"sandbox", id}, sp.files.LogArgs()...)...)
	}
	if sp.args != nil {
		log.L(ctx).Debug("rollback apply phases", append([]any{"sandbox", id}, sp.args...)...)
	}
}

// errNothingChanged marks a rollback refused before it changed anything (its target's stored
// contents are damaged): its intent is cleared instead of left pending.
var errNothingChanged = errors.New("nothing was changed")

// stopNewer stops the processes started since the target and drops its later effects (first:
// they may never be committed). The sandbox is frozen.
func (o *Orchestrator) stopNewer(ctx context.Context, s *session, in rollbackIntent, target ckptRecord, procs []pool.Proc, res *api.RollbackResult) error {
	var err error
	if target.ProcCkpt != nil { // copies of the templates replace the processes
		res.ProcessesStopped = killForCopies(s.kill, procs, s.unrestorable(target), int(s.sb.InitPid))
	} else if res.ProcessesStopped, err = killNewer(s.kill, procs, target.Procs, int(s.sb.InitPid)); err != nil {
		return err
	}
	if res.EffectsDropped, err = o.dropEffects(ctx, s, in.Watermark); err != nil {
		return fmt.Errorf("drop effects: %w", err)
	}
	return failpoint.Inject("rollback/after-effects")
}

// dropEffects drops the held effects after watermark. It asks the proxy only when there is
// something to drop, so that a rollback that drops nothing never waits for a commit that is
// sending.
func (o *Orchestrator) dropEffects(ctx context.Context, s *session, watermark uint64) (int, error) {
	after, err := o.effects.List(ctx, s.id, watermark, 0)
	if err != nil {
		return 0, err
	}
	todo := false
	for _, e := range after {
		todo = todo || e.Status == "held" || e.Status == "passed"
	}
	if !todo {
		return 0, nil
	}
	return o.effects.Rollback(ctx, s.id, watermark)
}

// undoState returns the agent state to the target's. A redo after a crash finds it done
// when the state moved since the rollback began (only the rollback moves it meanwhile).
func (s *session) undoState(ctx context.Context, in rollbackIntent) (int, error) {
	if s.state.Seq() != in.StateFrom {
		return 0, nil
	}
	switch {
	case in.StateBase:
		return s.restoreBaseState(ctx)
	case in.Rebuild:
		return s.rebuildState(ctx, in)
	}
	return s.state.RollbackTo(ctx, in.StateSeq)
}

// stateSeqAfter is the state seq at which the document is the target's once the rollback is
// done: the target's own when it is a point of the log, else that of the one patch that
// writes it (known before: nothing else changes the state during a rollback).
func (in rollbackIntent) stateSeqAfter() uint64 {
	if in.StateBase || in.Rebuild {
		return in.StateFrom + 1
	}
	return in.StateSeq
}

// finishPending redoes a rollback that failed after it began. Callers hold s.mu.
func (o *Orchestrator) finishPending(ctx context.Context, s *session) error {
	if err := s.takeAsyncError(); err != nil {
		return err
	}
	if err := o.syncRollback(s); err != nil {
		return err
	}
	if s.pending == nil {
		return nil
	}
	in := *s.pending
	log.L(ctx).Info("finishing a pending rollback", "sandbox", s.id, "checkpoint", in.Target)
	var res api.RollbackResult
	if _, err := o.undo(ctx, s, in, &res, false); err != nil {
		return fmt.Errorf("sandbox %q has a pending rollback to %s that cannot be finished yet: %w", s.id, in.Target, err)
	}
	return nil
}

// merged names the sandbox's root as its init sees it, the merged overlay mount, through
// the root fd the pool took when the init started (never /proc/PID/root by number: the pid
// may be reused once the init exits). done closes it; call it when the operation ends.
func (s *session) merged() (path string, done func(), err error) {
	open := s.sb.OpenRoot
	if s.openRoot != nil {
		open = s.openRoot
	}
	f, err := open()
	if err != nil {
		return "", nil, err
	}
	return pool.FDPath(f), func() { f.Close() }, nil
}

// killNewer SIGKILLs the sandbox's processes (now) that did not exist at the checkpoint (by
// pid and start time), never its init (whose pid an L3 restore changes; its exit would
// fence the sandbox). Signals to frozen processes take effect when they are thawed. The kill
// goes through pidfds of cgroup members (session.kill), so a pid reused since Procs is never hit.
func killNewer(kill func([]int) int, now, keep []pool.Proc, init int) (int, error) {
	old := make(map[pool.Proc]bool, len(keep))
	for _, p := range keep {
		old[p] = true
	}
	var pids []int
	for _, p := range now {
		if !old[p] && p.Pid != init {
			pids = append(pids, p.Pid)
		}
	}
	if len(pids) == 0 {
		return 0, nil
	}
	return kill(pids), nil
}

// resetFiles is the pool's Reset hook: on release, with only init left running, it returns
// the sandbox's files to its first checkpoint (the sandbox as leased).
func (o *Orchestrator) resetFiles(ctx context.Context, sb pool.Sandbox) error {
	s, err := o.session(ctx, sb.ID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ckpts) == 0 {
		return fmt.Errorf("sandbox %q has no base checkpoint: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	if s.dumped || len(s.inherited) > 0 || slices.ContainsFunc(s.ckpts, func(c ckptRecord) bool { return c.Level == api.LevelL3 }) {
		// CRIU cannot dump the processes of a sandbox that was dumped (or restored), then
		// reset and leased again ("Can't lookup mount ... Collect mappings failed"): such a
		// sandbox is destroyed, not reused, so that every lease can be snapshotted.
		return fmt.Errorf("sandbox %q was checkpointed at L3 or restored; not reused: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	merged, closeRoot, err := s.merged()
	if err != nil {
		return err
	}
	defer closeRoot()
	_, err = s.fs.Rollback(ctx, overlay.RollbackRequest{Merged: merged, Upper: sb.Layout.Upper,
		Lower: sb.Layout.Lower, Target: s.ckpts[0].ID})
	return err
}
