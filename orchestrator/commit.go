package orchestrator

import (
	"context"
	"fmt"

	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// Commit releases the sandbox's held effects and moves its commit point to the latest
// checkpoint: later rollbacks may not go to it or before it without force.
//
// The commit point and the commit in progress (the effect watermark it sends up to) are
// recorded durably before the first byte is sent, so no unforced rollback can undo a step
// whose effects may have been sent; after a crash, start-up finishes the commit. The
// effects are sent without the session lock: checkpoints, state patches, rollbacks (to
// checkpoints after the commit point) and verify go on while an upstream is slow.
func (o *Orchestrator) Commit(ctx context.Context, id string) (api.CommitResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.CommitResult{}, err
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	ci, err := o.beginCommit(ctx, s)
	if err != nil {
		return api.CommitResult{}, err
	}
	res := api.CommitResult{ID: id, Checkpoint: ci.Checkpoint}
	res.EffectsReleased, res.EffectsFailed, err = o.sendCommit(ctx, s, ci)
	if err != nil {
		return res, fmt.Errorf("commit sandbox %q (checkpoint %s is its commit point; the commit is finished later): %w", id, ci.Checkpoint, err)
	}
	log.L(ctx).Info("sandbox committed", "sandbox", id, "checkpoint", res.Checkpoint,
		"released", res.EffectsReleased, "failed", res.EffectsFailed)
	if res.EffectsFailed > 0 { // the commit point moved; the failed effects are the user's to decide
		return res, fmt.Errorf("commit sandbox %q (checkpoint %s is its commit point): %w", id, ci.Checkpoint, o.failedEffectsError(ctx, id, ci.Upto))
	}
	return res, nil
}

// beginCommit fixes the cut under the session lock: the latest checkpoint becomes the
// commit point and the effects journaled up to now are the ones the commit sends.
func (o *Orchestrator) beginCommit(ctx context.Context, s *session) (commitIntent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := o.finishPending(ctx, s); err != nil {
		return commitIntent{}, err
	}
	ci := commitIntent{Checkpoint: s.latest().ID, Upto: o.effects.Watermark(s.id)}
	if err := failpoint.Inject("commit/before-record"); err != nil {
		return commitIntent{}, err
	}
	meta := s.meta
	meta.CommitAfter, meta.Committing = ci.Checkpoint, &ci
	if err := s.rec.writeMeta(meta); err != nil {
		return commitIntent{}, fmt.Errorf("record commit point of %q: %w", s.id, err)
	}
	s.meta = meta
	return ci, nil
}

// sendCommit sends the commit's effects and then clears the commit in progress. s.commitMu
// is held, s.mu is not.
func (o *Orchestrator) sendCommit(ctx context.Context, s *session, ci commitIntent) (int, int, error) {
	if err := failpoint.Inject("commit/before-send"); err != nil {
		return 0, 0, err
	}
	released, failed, err := o.effects.Commit(ctx, s.id, ci.Upto)
	if err != nil {
		return released, failed, err
	}
	if err := failpoint.Inject("commit/after-send"); err != nil {
		return released, failed, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.meta.Committing == nil || *s.meta.Committing != ci {
		return released, failed, nil // a later commit took over
	}
	meta := s.meta
	meta.Committing = nil
	if err := s.rec.writeMeta(meta); err != nil {
		return released, failed, fmt.Errorf("record the end of the commit: %w", err)
	}
	s.meta = meta
	return released, failed, nil
}

// resumeCommit finishes, in the background, a commit that a previous process began.
func (o *Orchestrator) resumeCommit(ctx context.Context, s *session) {
	<-s.ready
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.RLock()
	ci := s.meta.Committing
	s.mu.RUnlock()
	if ci == nil {
		return
	}
	log.L(ctx).Info("resuming interrupted commit", "checkpoint", ci.Checkpoint, "upto", ci.Upto)
	released, failed, err := o.sendCommit(ctx, s, *ci)
	if err != nil {
		log.L(ctx).Error("resume interrupted commit", "checkpoint", ci.Checkpoint, "error", err)
		return
	}
	log.L(ctx).Info("interrupted commit finished", "checkpoint", ci.Checkpoint, "released", released, "failed", failed)
}
