package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// Retention bounds a sandbox's checkpoint tree: every path from the first checkpoint to a
// branch tip holds at most Options.RetainBranch checkpoints and the tree at most
// Options.Retain. It first folds the oldest checkpoints with a single child into that child
// (the layer store merges their files, the record their state ops: everything below stays
// restorable), and only when nothing else can go drops the oldest branch tips. It never
// drops the first checkpoint (the sandbox as leased), the head, a pinned checkpoint, the
// commit point or a branch point (a checkpoint with several children), so a tip keeps every
// checkpoint it needs.

// Folding a big checkpoint (the first full capture of thousands of files) into its child
// rewrites the child's pack: tens of milliseconds, at every checkpoint once the bound is
// reached. So a fold of more than foldInline entries runs after the answer (foldLater),
// prepared without the session lock and installed under it, while the tree holds at most
// foldSlack more checkpoints than its bounds meanwhile (Retain/8: none for small bounds);
// past that, the checkpoint folds inline. A folder that fell behind folds the victims in a
// row at once, so a run of checkpoints rewrites the big one once, not at each.

// foldInline is the most entries (folded checkpoints and child) a fold runs inline with
// the checkpoint that needs it (~2 ms here; BenchmarkDeleteFull, 5,000 entries: 12-35 ms).
const foldInline = 1000

// maxOvertaken is how many folds in a row the folder prepares that the tree overtook before
// it stops (until the next checkpoint past the bounds starts it again).
const maxOvertaken = 3

// foldSlack is how many checkpoints beyond its bounds a tree may hold while the folder runs.
func (o *Orchestrator) foldSlack() int { return max(o.opts.Retain, 2) / 8 }

// retain drops checkpoints beyond the bounds; the state log is then compacted to what the
// head and the ancestors still on the log need. Callers hold s.mu.
func (o *Orchestrator) retain(ctx context.Context, s *session) {
	victims := s.retentionVictims(o.retainBounds())
	if len(victims) == 0 || (s.folding && len(victims) <= o.foldSlack()) {
		return
	}
	if len(victims) <= o.foldSlack() && len(s.children(victims[0])) == 1 &&
		s.fs.Entries(victims[0])+s.fs.Entries(s.children(victims[0])[0]) > foldInline {
		o.foldLater(ctx, s)
		return
	}
	deleted := false
	for _, victim := range victims {
		if err := o.dropCheckpoint(ctx, s, victim); err != nil {
			log.L(ctx).Warn("retention: delete checkpoint", "sandbox", s.id, "checkpoint", victim, "error", err)
			break
		}
		deleted = true
	}
	if deleted {
		o.compact(ctx, s)
	}
}

// retainBounds returns the tree's bound and the per-branch one.
func (o *Orchestrator) retainBounds() (int, int) {
	total, perBranch := max(o.opts.Retain, 2), o.opts.RetainBranch
	if perBranch <= 0 || perBranch > total {
		perBranch = total
	}
	return total, max(perBranch, 2)
}

// compact compacts the state log to what the head and its ancestors on the log still need.
func (o *Orchestrator) compact(ctx context.Context, s *session) {
	if err := s.state.Compact(ctx, s.compactPoint()); err != nil && !errdefs.IsFailedPrecondition(err) {
		log.L(ctx).Warn("retention: compact state", "sandbox", s.id, "error", err)
	}
}

// foldLater starts the session's folder unless it runs. Callers hold s.mu.
func (o *Orchestrator) foldLater(ctx context.Context, s *session) {
	if s.folding {
		return
	}
	s.folding, s.foldTries = true, 0
	ctx = context.WithoutCancel(ctx)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		for o.foldOnce(ctx, s) {
		}
	}()
}

// foldOnce is one round of the folder: it takes the leading victims of retention that fold
// in a row (a leaf victim is dropped as retain does), prepares their fold without the
// session lock and installs it under it. It reports whether to go on; the folder stops
// (clearing s.folding) when nothing is left to drop, the session ended, or a fold failed.
func (o *Orchestrator) foldOnce(ctx context.Context, s *session) bool {
	s.mu.Lock()
	run, more := o.nextFold(ctx, s)
	compact := ""
	if len(run) == 0 && more && s.toCompact != "" {
		compact, s.toCompact = s.toCompact, ""
	}
	s.mu.Unlock()
	if compact != "" {
		o.compactOnce(ctx, s, compact)
		return true
	}
	if len(run) == 0 {
		return more
	}
	start := time.Now()
	pf, err := s.fs.PrepareFold(ctx, run, mergeRecords)
	if err != nil {
		log.L(ctx).Warn("retention: prepare a fold", "sandbox", s.id, "checkpoints", run, "error", err)
		o.stopFolding(s)
		return false
	}
	prepared := time.Now()
	s.mu.Lock()
	locked := time.Now()
	err = o.installFold(ctx, s, run, pf)
	overtaken := errdefs.IsFailedPrecondition(err) // the tree moved meanwhile: choose again
	switch {
	case err == nil:
		s.foldTries = 0
	case overtaken:
		s.foldTries++
	}
	again := s.foldTries < maxOvertaken
	s.mu.Unlock()
	installed := time.Now()
	if err != nil {
		pf.Abort()
		if overtaken {
			log.L(ctx).Debug("retention: fold overtaken", "sandbox", s.id, "checkpoints", run, "again", again, "error", err)
			if !again { // each try writes a merged pack: the next checkpoint starts anew
				o.stopFolding(s)
			}
			return again
		}
		log.L(ctx).Warn("retention: fold", "sandbox", s.id, "checkpoints", run, "error", err)
		o.stopFolding(s)
		return false
	}
	if err := pf.Finish(); err != nil {
		log.L(ctx).Warn("retention: finish a fold", "sandbox", s.id, "checkpoints", run, "error", err)
	}
	for _, id := range run {
		_ = s.rec.remove(id)
	}
	log.L(ctx).Debug("retention: folded", "sandbox", s.id, "checkpoints", run, "prepare", prepared.Sub(start),
		"lock_wait", locked.Sub(prepared), "install", installed.Sub(locked), "finish", time.Since(installed))
	return true
}

// compactOnce makes checkpoint id (an automatic L2, cut as a delta) self-contained in the
// layer store: prepared without the session lock, installed under it. A compaction the tree
// overtook (an ancestor folded meanwhile) is tried again, up to three times.
func (o *Orchestrator) compactOnce(ctx context.Context, s *session, id string) {
	start := time.Now()
	pf, err := s.fs.PrepareCompact(ctx, id)
	if err != nil || pf == nil {
		if err != nil {
			log.L(ctx).Warn("compact an automatic l2", "sandbox", s.id, "checkpoint", id, "error", err)
		}
		return
	}
	prepared := time.Now()
	s.mu.Lock()
	if s.ended || o.closed.Load() {
		err = fmt.Errorf("the session ended: %w", errdefs.ErrFailedPrecondition)
	} else {
		err = pf.Commit(ctx)
	}
	if errdefs.IsFailedPrecondition(err) && !s.ended && s.find(id) >= 0 && s.compactTries < 3 && s.toCompact == "" {
		s.compactTries++
		s.toCompact = id
	}
	if err == nil {
		s.compactTries = 0
	}
	s.mu.Unlock()
	if err != nil {
		pf.Abort()
		log.L(ctx).Debug("compact an automatic l2", "sandbox", s.id, "checkpoint", id, "error", err)
		return
	}
	if err := pf.Finish(); err != nil {
		log.L(ctx).Warn("finish a compaction", "sandbox", s.id, "checkpoint", id, "error", err)
	}
	log.L(ctx).Debug("automatic l2 compacted", "sandbox", s.id, "checkpoint", id, "prepare", prepared.Sub(start),
		"install", time.Since(prepared))
}

// nextFold returns the run the folder folds next (nil when none; more reports whether the
// folder goes on: false once nothing is left, no compaction waiting either). Callers hold
// s.mu.
func (o *Orchestrator) nextFold(ctx context.Context, s *session) (run []string, more bool) {
	if s.ended || o.closed.Load() {
		s.folding = false
		return nil, false
	}
	victims := s.retentionVictims(o.retainBounds())
	if len(victims) == 0 {
		if s.toCompact != "" {
			return nil, true
		}
		s.folding = false
		return nil, false
	}
	if len(s.children(victims[0])) == 0 { // a tip: cheap
		if err := o.dropCheckpoint(ctx, s, victims[0]); err != nil {
			log.L(ctx).Warn("retention: delete checkpoint", "sandbox", s.id, "checkpoint", victims[0], "error", err)
			s.folding = false
			return nil, false
		}
		o.compact(ctx, s)
		return nil, true
	}
	run = victims[:1]
	for _, v := range victims[1:] {
		if kids := s.children(run[len(run)-1]); len(kids) != 1 || kids[0] != v || len(s.children(v)) != 1 {
			break
		}
		run = append(run, v)
	}
	return slices.Clone(run), true
}

// stopFolding clears s.folding after a failure (the next checkpoint tries again).
func (o *Orchestrator) stopFolding(s *session) {
	s.mu.Lock()
	s.folding = false
	s.mu.Unlock()
}

// installFold installs the prepared fold of run (retention's victims in a row, top down)
// when they are still what it would fold: each still there, unprotected, the only child of
// the one before (errdefs.ErrFailedPrecondition otherwise, with nothing changed). The
// records follow the store: each child absorbs its folded parent's. Callers hold s.mu.
func (o *Orchestrator) installFold(ctx context.Context, s *session, run []string, pf preparedFold) error {
	if s.ended || o.closed.Load() {
		return fmt.Errorf("the session ended: %w", errdefs.ErrFailedPrecondition)
	}
	for i, id := range run {
		kids := s.children(id)
		if s.find(id) < 0 || s.protected(id) || len(kids) != 1 || (i+1 < len(run) && kids[0] != run[i+1]) {
			return fmt.Errorf("checkpoint %s changed since its fold was prepared: %w", id, errdefs.ErrFailedPrecondition)
		}
	}
	start := time.Now()
	if err := pf.Commit(ctx); err != nil {
		return err
	}
	committed := time.Now()
	for _, id := range run {
		o.forgetFolded(ctx, s, id)
	}
	forgot := time.Now()
	o.compact(ctx, s)
	log.L(ctx).Debug("retention: fold installed", "sandbox", s.id, "commit", committed.Sub(start),
		"records", forgot.Sub(committed), "compact", time.Since(forgot))
	return nil
}

// retentionVictims returns what retention drops now, in order: retentionVictim until it
// finds none, each victim's children taking its parent as a drop would. Callers hold s.mu
// (s.ckpts is replaced meanwhile).
func (s *session) retentionVictims(total, perBranch int) []string {
	saved := s.ckpts
	s.ckpts = slices.Clone(saved)
	defer func() { s.ckpts = saved }()
	var out []string
	for range len(saved) {
		v := s.retentionVictim(total, perBranch)
		if v == "" {
			break
		}
		i := s.find(v)
		for _, kid := range s.children(v) {
			s.ckpts[s.find(kid)].Parent = s.ckpts[i].Parent
		}
		s.ckpts = slices.Delete(s.ckpts, i, i+1)
		out = append(out, v)
	}
	return out
}

// protected reports whether retention must keep checkpoint id.
func (s *session) protected(id string) bool {
	return id == s.ckpts[0].ID || id == s.head || s.pinned(id) || id == s.meta.CommitAfter ||
		(s.meta.Committing != nil && s.meta.Committing.Checkpoint == id) || len(s.children(id)) > 1
}

// retentionVictim returns the next checkpoint retention drops ("" for none).
func (s *session) retentionVictim(total, perBranch int) string {
	foldable := func(id string) bool { return !s.protected(id) && len(s.children(id)) == 1 }
	for _, c := range s.ckpts { // per branch: the oldest foldable checkpoint of a long path
		if len(s.children(c.ID)) > 0 {
			continue
		}
		path := s.ancestors(c.ID)
		if len(path) <= perBranch {
			continue
		}
		for i := len(path) - 1; i >= 0; i-- {
			if foldable(path[i]) {
				return path[i]
			}
		}
	}
	if len(s.ckpts) <= total {
		return ""
	}
	for _, c := range s.ckpts {
		if foldable(c.ID) {
			return c.ID
		}
	}
	for _, c := range s.ckpts { // only tips and protected checkpoints are left
		if !s.protected(c.ID) && len(s.children(c.ID)) == 0 {
			return c.ID
		}
	}
	return ""
}

// dropCheckpoint deletes checkpoint id (at most one child, which absorbs it) with its
// resources.
func (o *Orchestrator) dropCheckpoint(ctx context.Context, s *session, id string) error {
	if s.find(id) < 0 {
		return fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	if err := s.fs.Delete(ctx, id, mergeRecords); err != nil {
		return err
	}
	o.forgetFolded(ctx, s, id)
	_ = s.rec.remove(id)
	return nil
}

// forgetFolded drops checkpoint id, deleted from the store, from the session: its child (at
// most one) absorbs its record, and its resources go.
func (o *Orchestrator) forgetFolded(ctx context.Context, s *session, id string) {
	i := s.find(id)
	victim := s.ckpts[i]
	for _, kid := range s.children(id) {
		k := &s.ckpts[s.find(kid)]
		foldRecord(&victim, k)
	}
	s.ckpts = slices.Delete(s.ckpts, i, i+1)
	o.dropCheckpointResources(ctx, s, victim)
}

// foldRecord makes child's record stand for parent's and its own: its parent and state ops
// start where parent's did.
func foldRecord(parent, child *ckptRecord) {
	child.Parent = parent.Parent
	child.StateOps = append(slices.Clone(parent.StateOps), child.StateOps...)
	child.TreeOps = parent.TreeOps && child.TreeOps
}

// mergeRecords is the layer store's MetaMerge for records.
func mergeRecords(parentMeta, childMeta []byte) ([]byte, error) {
	var parent, child ckptRecord
	if err := json.Unmarshal(parentMeta, &parent); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(childMeta, &child); err != nil {
		return nil, err
	}
	foldRecord(&parent, &child)
	return json.Marshal(child)
}

// dropCheckpointResources frees what a checkpoint holds besides its files and record: its
// CRIU images (L3) and its process templates (processes.go). Every path that removes a
// checkpoint calls it.
func (o *Orchestrator) dropCheckpointResources(_ context.Context, s *session, rec ckptRecord) {
	removeImages(rec)
	s.releaseTemplates(rec.ID)
}

// compactPoint is the state seq retention may compact to: the head's, or an older point of
// the log that a checkpoint on the head's path still names (a rollback there undoes ops
// instead of replaying the tree). The first checkpoint needs nothing when its document is
// kept.
func (s *session) compactPoint() uint64 {
	keep := s.headSeq
	for _, id := range s.ancestors(s.head) {
		c := s.ckpts[s.find(id)]
		if c.Parent == "" && s.hasBaseState(c.StateSeq) {
			continue
		}
		if s.state.Has(c.StateSeq) {
			keep = min(keep, c.StateSeq)
		}
	}
	return keep
}

// pin sets or clears a checkpoint's pin (best effort: a failure is logged).
func (o *Orchestrator) pin(ctx context.Context, s *session, id string, on bool) {
	meta := s.meta
	meta.Pins = slices.DeleteFunc(slices.Clone(meta.Pins), func(p string) bool { return p == id })
	if on {
		meta.Pins = append(meta.Pins, id)
	}
	if err := s.rec.writeMeta(meta); err != nil {
		log.L(ctx).Error("record pin", "sandbox", s.id, "checkpoint", id, "error", err)
		return
	}
	s.meta = meta
}

// Pin pins (or, with on false, unpins) a checkpoint of a sandbox: retention never drops a
// pinned checkpoint. The pin is recorded in the session's meta.json.
func (o *Orchestrator) Pin(ctx context.Context, id, ckpt string, on bool) (api.Checkpoint, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.Checkpoint{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i, err := s.resolve(ckpt)
	if err != nil {
		return api.Checkpoint{}, err
	}
	c := s.ckpts[i]
	meta := s.meta
	meta.Pins = slices.DeleteFunc(slices.Clone(meta.Pins), func(p string) bool { return p == c.ID })
	if on {
		meta.Pins = append(meta.Pins, c.ID)
	}
	if err := s.rec.writeMeta(meta); err != nil {
		return api.Checkpoint{}, fmt.Errorf("record the pin of checkpoint %s: %w", c.ID, err)
	}
	s.meta = meta
	if !on {
		o.retain(ctx, s) // what the pin kept may go now
	}
	return s.view(c), nil
}
