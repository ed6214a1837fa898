package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

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

// retain drops checkpoints beyond the bounds; the state log is then compacted to what the
// head and the ancestors still on the log need.
func (o *Orchestrator) retain(ctx context.Context, s *session) {
	deleted := false
	total, perBranch := max(o.opts.Retain, 2), o.opts.RetainBranch
	if perBranch <= 0 || perBranch > total {
		perBranch = total
	}
	for range len(s.ckpts) {
		victim := s.retentionVictim(total, max(perBranch, 2))
		if victim == "" {
			break
		}
		if err := o.dropCheckpoint(ctx, s, victim); err != nil {
			log.L(ctx).Warn("retention: delete checkpoint", "sandbox", s.id, "checkpoint", victim, "error", err)
			break
		}
		deleted = true
	}
	if !deleted {
		return
	}
	if err := s.state.Compact(ctx, s.compactPoint()); err != nil && !errdefs.IsFailedPrecondition(err) {
		log.L(ctx).Warn("retention: compact state", "sandbox", s.id, "error", err)
	}
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
	i := s.find(id)
	if i < 0 {
		return fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	victim := s.ckpts[i]
	if err := s.fs.Delete(ctx, id, mergeRecords); err != nil {
		return err
	}
	for _, kid := range s.children(id) {
		k := &s.ckpts[s.find(kid)]
		foldRecord(&victim, k)
	}
	s.ckpts = slices.Delete(s.ckpts, i, i+1)
	_ = s.rec.remove(id)
	o.dropCheckpointResources(ctx, s, victim)
	return nil
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
