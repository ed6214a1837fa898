package state

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// PatchOptions qualify a patch.
type PatchOptions struct {
	// IfSeq, when set, applies the patch only if the current sequence number equals it;
	// otherwise Patch fails with errdefs.ErrConflict and changes nothing.
	IfSeq *uint64
	// Checkpoint is the caller's checkpoint ID recorded with every op of the patch.
	Checkpoint string
}

// PatchResult says what a patch did.
type PatchResult struct {
	Seq     uint64 `json:"seq"`     // sequence number after the patch (that of its last op)
	Applied int    `json:"applied"` // ops applied (all of them)
}

// Patch applies ops atomically and durably: every op gets the next sequence number and is
// logged with its inverse; the call returns after the log record is fsynced (shared with
// concurrent calls). On any error the document and log are unchanged. Errors: a malformed or
// inapplicable op, or a limit exceeded, wraps errdefs.ErrInvalidArgument (an *OpError names
// the op); a failed "test" op errdefs.ErrFailedPrecondition; an IfSeq mismatch
// errdefs.ErrConflict. An empty patch changes nothing and logs nothing.
//
// The context is checked before the patch is applied; once applied, the call completes.
func (s *Store) Patch(ctx context.Context, ops []Op, opt PatchOptions) (PatchResult, error) {
	if err := ctx.Err(); err != nil {
		return PatchResult{}, err
	}
	compiled, err := s.compile(ops)
	if err != nil {
		return PatchResult{}, err
	}
	s.mu.Lock()
	pos, res, err := s.patchLocked(compiled, ops, opt)
	s.mu.Unlock()
	if err != nil {
		return PatchResult{}, err
	}
	defer s.inflight.Done()
	if err := s.durable(pos); err != nil {
		return PatchResult{}, fmt.Errorf("patch: %w", err)
	}
	log.L(ctx).Debug("state patched", "seq", res.Seq, "ops", res.Applied, "checkpoint", opt.Checkpoint)
	s.maybeSnapshot(res.Seq)
	return res, nil
}

// compile validates ops against the limits and decodes their values, outside the lock.
func (s *Store) compile(ops []Op) ([]compiledOp, error) {
	if s.opts.maxOps > 0 && len(ops) > s.opts.maxOps {
		return nil, fmt.Errorf("patch has %d ops, more than the limit of %d: %w", len(ops), s.opts.maxOps, errdefs.ErrInvalidArgument)
	}
	out := make([]compiledOp, len(ops))
	for i, o := range ops {
		c, err := compileOp(o, s.opts.maxValueSize)
		if err != nil {
			return nil, opError(i, o, err, errdefs.ErrInvalidArgument)
		}
		out[i] = c
	}
	return out, nil
}

// patchLocked applies and logs a patch; mu must be held. On success the caller must wait for
// pos and call s.inflight.Done().
func (s *Store) patchLocked(compiled []compiledOp, ops []Op, opt PatchOptions) (uint64, PatchResult, error) {
	if err := s.begin(); err != nil {
		return 0, PatchResult{}, err
	}
	pos, res, err := s.applyAndLog(compiled, ops, opt)
	if err != nil {
		s.inflight.Done()
	}
	return pos, res, err
}

func (s *Store) applyAndLog(compiled []compiledOp, ops []Op, opt PatchOptions) (uint64, PatchResult, error) {
	seq := s.hist.last()
	if opt.IfSeq != nil && *opt.IfSeq != seq {
		return 0, PatchResult{}, fmt.Errorf("patch: seq is %d, not %d: %w", seq, *opt.IfSeq, errdefs.ErrConflict)
	}
	if len(ops) == 0 {
		return 0, PatchResult{Seq: seq}, nil
	}
	oldSize := s.doc.size
	invs, err := s.doc.applyOps(compiled, ops)
	if err != nil {
		return 0, PatchResult{}, s.checkInternal(err)
	}
	if s.doc.size > s.opts.maxDocSize && s.doc.size > oldSize {
		size := s.doc.size
		if err := s.doc.undo(invs); err != nil {
			return 0, PatchResult{}, s.checkInternal(err)
		}
		return 0, PatchResult{}, fmt.Errorf("patch would make the document %d bytes, more than the limit of %d: %w",
			size, s.opts.maxDocSize, errdefs.ErrInvalidArgument)
	}
	entries := makeEntries(seq, ops, invs, opt.Checkpoint)
	pos, err := s.write(record{Type: recPatch, Entries: entries})
	if err != nil {
		if uerr := s.doc.undo(invs); uerr != nil {
			return 0, PatchResult{}, s.checkInternal(uerr)
		}
		return 0, PatchResult{}, err
	}
	for i := range entries {
		s.hist.items = append(s.hist.items, item{seq: entries[i].Seq, entry: &entries[i]})
	}
	return pos, PatchResult{Seq: s.hist.last(), Applied: len(ops)}, nil
}

func makeEntries(seq uint64, ops []Op, invs [][]Op, checkpoint string) []Entry {
	now := time.Now().UTC()
	entries := make([]Entry, len(ops))
	for i, o := range ops {
		o = o.clone()
		if len(o.Value) > 0 { // as the log stores it, so Log reads the same before and after a reopen
			var buf bytes.Buffer
			if json.Compact(&buf, o.Value) == nil {
				o.Value = buf.Bytes()
			}
		}
		entries[i] = Entry{Seq: seq + uint64(i) + 1, Checkpoint: checkpoint, Op: o, Inverse: invs[i], Time: now}
	}
	return entries
}

// checkInternal fails the store when err says the document could not be restored; mu held.
func (s *Store) checkInternal(err error) error {
	if errors.Is(err, errdefs.ErrInternal) && s.failed == nil {
		s.failed = fmt.Errorf("state store failed, reopen it: %w", err)
	}
	return err
}

// RollbackTo returns the document to its state at seq by applying, newest first, the inverses
// of the ops after it, all or nothing, and records the rollback durably in the log. seq must be
// a point of the current history: the compaction base or the number of an op or rollback that
// has not itself been rolled back (else errdefs.ErrFailedPrecondition; later than Seq() is
// errdefs.ErrInvalidArgument). Rolling back to Seq() is a no-op.
//
// Numbering stays monotonic: the rollback takes the next sequence number as a marker, so
// Seq() afterwards is new (IfSeq taken before the rollback conflicts), the marker is itself a
// rollback target equal to the state at seq, and the undone ops leave the history (Log no
// longer returns them and they cannot be rolled back to).
func (s *Store) RollbackTo(ctx context.Context, seq uint64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	pos, n, err := s.rollbackLocked(seq)
	s.mu.Unlock()
	if err != nil || pos == 0 {
		return 0, err
	}
	defer s.inflight.Done()
	if err := s.durable(pos); err != nil {
		return 0, fmt.Errorf("rollback to %d: %w", seq, err)
	}
	cur := s.Seq()
	log.L(ctx).Debug("state rolled back", "to", seq, "undone", n, "seq", cur)
	s.maybeSnapshot(cur)
	return n, nil
}

// rollbackLocked undoes and logs; mu must be held. pos 0 means nothing was done; otherwise the
// caller waits for pos and calls s.inflight.Done().
func (s *Store) rollbackLocked(seq uint64) (uint64, int, error) {
	if err := s.begin(); err != nil {
		return 0, 0, err
	}
	pos, n, err := s.undoAndLog(seq)
	if err != nil || pos == 0 {
		s.inflight.Done()
	}
	return pos, n, err
}

func (s *Store) undoAndLog(seq uint64) (uint64, int, error) {
	cur := s.hist.last()
	switch {
	case seq == cur:
		return 0, 0, nil
	case seq > cur:
		return 0, 0, fmt.Errorf("rollback to %d: after the current seq %d: %w", seq, cur, errdefs.ErrInvalidArgument)
	case seq < s.hist.base:
		return 0, 0, fmt.Errorf("rollback to %d: the log was compacted up to %d: %w", seq, s.hist.base, errdefs.ErrFailedPrecondition)
	}
	i, ok := s.hist.cut(seq)
	if !ok {
		return 0, 0, fmt.Errorf("rollback to %d: not in the current history (it was rolled back): %w", seq, errdefs.ErrFailedPrecondition)
	}
	undone := s.hist.items[i:]
	n, err := s.undoItems(undone)
	if err != nil {
		return 0, 0, s.checkInternal(err)
	}
	marker := item{seq: cur + 1}
	pos, err := s.write(record{Type: recRollback, Seq: marker.seq, To: seq, Time: time.Now().UTC()})
	if err != nil {
		if rerr := s.redoItems(undone); rerr != nil {
			return 0, 0, s.checkInternal(fmt.Errorf("%v: %w", rerr, errdefs.ErrInternal))
		}
		return 0, 0, err
	}
	s.hist.items = append(s.hist.items[:i], marker)
	return pos, n, nil
}

// Log returns the ops of the current history with from < seq <= to, oldest first (rollback
// markers and undone ops are not included). from below the compaction point wraps
// errdefs.ErrFailedPrecondition.
func (s *Store) Log(from, to uint64) ([]Entry, error) {
	if to < from {
		return nil, fmt.Errorf("log (%d, %d]: empty range: %w", from, to, errdefs.ErrInvalidArgument)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	if from < s.hist.base {
		return nil, fmt.Errorf("log from %d: compacted up to %d: %w", from, s.hist.base, errdefs.ErrFailedPrecondition)
	}
	i, _ := s.hist.cut(from)
	var out []Entry
	for _, it := range s.hist.items[i:] {
		if it.seq > to {
			break
		}
		if it.entry != nil {
			out = append(out, it.entry.clone())
		}
	}
	return out, nil
}
