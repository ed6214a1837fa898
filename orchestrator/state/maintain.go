package state

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// maybeSnapshot starts a background snapshot when enough has been logged since the last one.
func (s *Store) maybeSnapshot(seq uint64) {
	every := uint64(s.opts.snapshotEvery)
	if every == 0 || seq < s.snapSeq.Load()+every || !s.bgRunning.CompareAndSwap(false, true) {
		return
	}
	s.mu.RLock()
	closed := s.closed
	if !closed {
		s.background.Add(1)
	}
	s.mu.RUnlock()
	if closed {
		s.bgRunning.Store(false)
		return
	}
	go func() {
		defer s.background.Done()
		defer s.bgRunning.Store(false)
		if err := s.Snapshot(s.ctx); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			log.L(s.ctx).Warn("background state snapshot failed", "dir", s.dir, "error", err)
		}
	}()
}

// Snapshot writes the whole document at the current seq atomically, once the log holds
// everything up to that seq durably, so that Open replays only what follows.
func (s *Store) Snapshot(ctx context.Context) error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	s.mu.RLock()
	if err := s.usable(); err != nil {
		s.mu.RUnlock()
		return err
	}
	s.inflight.Add(1) // under mu with closed == false: Close waits for us
	defer s.inflight.Done()
	seq, pos := s.hist.last(), s.commit.written.Load()
	doc, err := encode(s.doc.root)
	s.mu.RUnlock()
	if err != nil || seq == s.snapSeq.Load() {
		return err
	}
	if err := s.durable(pos); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := writeSnapshot(s.dir, seq, doc); err != nil {
		return fmt.Errorf("snapshot at seq %d: %w", seq, err)
	}
	s.snapSeq.Store(seq)
	log.L(ctx).Debug("state snapshot written", "dir", s.dir, "seq", seq, "bytes", len(doc))
	return nil
}

// Compact drops the log entries at or before keep, which no retained checkpoint needs; keep
// must be a point of the current history (see RollbackTo). It first writes a full snapshot
// at the current seq (from which, with the retained ops' inverses, the state at keep remains
// reachable), then atomically replaces the log with one that starts at keep and holds only
// the current history after it (undone ops and rollback records are dropped). Afterwards
// RollbackTo and Log below keep fail with errdefs.ErrFailedPrecondition. Patches wait while
// compaction runs.
func (s *Store) Compact(ctx context.Context, keep uint64) error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	i, err := s.checkCompactPoint(keep)
	if err != nil || (keep == s.hist.base && s.snapSeq.Load() == s.hist.last()) {
		return err
	}
	if err := s.compactLocked(keep, i); err != nil {
		return fmt.Errorf("compact state to %d: %w", keep, err)
	}
	log.L(ctx).Debug("state compacted", "dir", s.dir, "base", keep, "seq", s.hist.last())
	return nil
}

func (s *Store) checkCompactPoint(keep uint64) (int, error) {
	if keep < s.hist.base {
		return 0, fmt.Errorf("compact to %d: already compacted to %d: %w", keep, s.hist.base, errdefs.ErrFailedPrecondition)
	}
	if keep > s.hist.last() {
		return 0, fmt.Errorf("compact to %d: after the current seq %d: %w", keep, s.hist.last(), errdefs.ErrInvalidArgument)
	}
	i, ok := s.hist.cut(keep)
	if !ok {
		return 0, fmt.Errorf("compact to %d: not in the current history: %w", keep, errdefs.ErrFailedPrecondition)
	}
	return i, nil
}

// compactLocked does the work of Compact; mu and snapMu are held, so no write is in flight
// except fsyncs of what is already written.
func (s *Store) compactLocked(keep uint64, i int) error {
	if err := s.commit.wait(s.commit.written.Load()); err != nil {
		s.failed = fmt.Errorf("state store failed, reopen it: %w", err)
		return err
	}
	doc, err := encode(s.doc.root)
	if err != nil {
		return err
	}
	seq := s.hist.last()
	if err := writeSnapshot(s.dir, seq, doc); err != nil {
		return err
	}
	s.snapSeq.Store(seq)
	kept := append([]item(nil), s.hist.items[i:]...)
	size, err := s.rewriteLog(keep, kept)
	if err != nil {
		return err
	}
	l, err := openLog(filepath.Join(s.dir, logName))
	if err != nil {
		s.failed = fmt.Errorf("state store failed, reopen it: %w", err)
		return err
	}
	old := s.log
	s.log, s.logLen = l, size
	s.commit.swap(l)
	s.hist = history{base: keep, items: kept}
	return old.Close()
}

// rewriteLog writes a log holding a base record at keep and then items, and renames it over
// the current log.
func (s *Store) rewriteLog(keep uint64, items []item) (int64, error) {
	buf, err := appendFrame(nil, record{Type: recBase, Seq: keep})
	if err != nil {
		return 0, err
	}
	prev := keep
	for _, it := range items {
		rec := record{Type: recRollback, Seq: it.seq, To: prev}
		if it.entry != nil {
			rec = record{Type: recPatch, Entries: []Entry{*it.entry}}
		}
		if buf, err = appendFrame(buf, rec); err != nil {
			return 0, err
		}
		prev = it.seq
	}
	if err := writeFileAtomic(s.dir, logName, buf); err != nil {
		return 0, err
	}
	return int64(len(buf)), nil
}

// Verify rebuilds the state from the directory (snapshot + log) and compares it with the live
// one. A mismatch wraps errdefs.ErrDataLoss and names the differing pointers.
func (s *Store) Verify(ctx context.Context) error {
	s.mu.Lock() // no writes while the files are read
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	r, err := rebuild(s.dir, s.opts.maxDepth)
	if err != nil {
		return fmt.Errorf("verify: rebuild: %w", err)
	}
	if err := s.compare(r); err != nil {
		return fmt.Errorf("verify %s: %w: %w", s.dir, err, errdefs.ErrDataLoss)
	}
	log.L(ctx).Debug("state verified", "dir", s.dir, "seq", s.hist.last())
	return nil
}

func (s *Store) compare(r *rebuilt) error {
	if got, want := r.hist.last(), s.hist.last(); got != want {
		return fmt.Errorf("rebuilt seq %d, live seq %d", got, want)
	}
	if got, want := len(r.hist.items), len(s.hist.items); got != want || r.hist.base != s.hist.base {
		return fmt.Errorf("rebuilt history has %d points from %d, live %d from %d", got, r.hist.base, want, s.hist.base)
	}
	var diffs []string
	diffPointers(r.doc.root, s.doc.root, pointer{}, &diffs, 10)
	if len(diffs) > 0 {
		return fmt.Errorf("documents differ at %s", strings.Join(diffs, ", "))
	}
	enc, err := encode(s.doc.root)
	if err != nil {
		return err
	}
	if int64(len(enc)) != s.doc.size {
		return fmt.Errorf("tracked document size %d, actual %d", s.doc.size, len(enc))
	}
	return nil
}

// diffPointers appends (up to max) pointers at which a and b differ, as deep as they differ.
func diffPointers(a, b any, at pointer, out *[]string, max int) {
	if len(*out) >= max || deepEqual(a, b) {
		return
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		for k := range unionKeys(am, bm) {
			av, inA := am[k]
			bv, inB := bm[k]
			if inA != inB {
				*out = append(*out, fmt.Sprintf("%q", at.child(k).String()))
				continue
			}
			diffPointers(av, bv, at.child(k), out, max)
		}
		return
	}
	aa, aok := a.([]any)
	ba, bok := b.([]any)
	if aok && bok && len(aa) == len(ba) {
		for i := range aa {
			diffPointers(aa[i], ba[i], at.child(fmt.Sprint(i)), out, max)
		}
		return
	}
	*out = append(*out, fmt.Sprintf("%q", at.String()))
}

func unionKeys(a, b map[string]any) map[string]struct{} {
	keys := make(map[string]struct{}, len(a)+len(b))
	for k := range a {
		keys[k] = struct{}{}
	}
	for k := range b {
		keys[k] = struct{}{}
	}
	return keys
}
