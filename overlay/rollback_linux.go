//go:build linux

package overlay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// Rollback restores the merged tree to checkpoint req.Target, anywhere in the tree: every
// path changed on the way from the head up to the common ancestor and down to the target (in
// those checkpoints, or not yet captured) gets back its content, type, mode, owner, mtime,
// xattrs, symlink target and hard links as of the target, or is removed if it did not exist
// then; lower-dir paths changed since are restored from the lower content. All writes go
// through the merged mount, never following a symlink the sandbox made. A regular file that
// has a single link both now and at the target is rewritten in place (same inode: a process
// holding it open sees the restored content); other entries are removed and recreated. The
// caller keeps the sandbox frozen.
//
// The target becomes the head; no checkpoint is deleted (the head's branch stays, and can be
// rolled back to). The index is moved to the upper dir as the writes left it, so the next L1
// capture is relative to the target; it also records the paths the rollback rewrote, as the
// upper dir now holds them. Right after a rollback, Diff against the current upper dir may
// list those paths as modified although their merged view equals the target. A failed
// rollback can be retried; it recomputes what differs.
func (s *Store) Rollback(ctx context.Context, req RollbackRequest) (*RollbackResult, error) {
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.prepareTemp()
	var ph rollbackPhases
	res, err := s.rollback(ctx, req, &ph)
	if err != nil {
		return nil, fmt.Errorf("rollback to %s: %w", req.Target, err)
	}
	end := time.Now()
	res.Phases = RollbackPhases{Total: end.Sub(start), Scan: ph.scanned.Sub(start), Plan: ph.planned.Sub(ph.scanned),
		BeforeWrite: ph.writing.Sub(ph.planned), Write: ph.written.Sub(ph.writing), Index: end.Sub(ph.written)}
	if !req.Deferred { // a deferred rollback's caller logs them once the sandbox runs again
		log.L(ctx).Debug("overlay rolled back", append([]any{"checkpoint", req.Target, "files_restored", res.FilesRestored},
			res.Phases.LogArgs()...)...)
	}
	return res, nil
}

// rollbackPhases are the times at which a rollback's phases ended (the debug log's spans).
type rollbackPhases struct{ scanned, planned, writing, written time.Time }

func (s *Store) rollback(ctx context.Context, req RollbackRequest, ph *rollbackPhases) (*RollbackResult, error) {
	fds, err := openRollbackRoots(req)
	if err != nil {
		return nil, err
	}
	defer fds.close()
	w, err := s.workOut(ctx, req, fds, ph)
	if err != nil {
		return nil, err
	}
	defer w.close()
	return s.applyWorked(w, req.Meta, req.Deferred, req.BeforeWrite, ph)
}

// worked is a rollback worked out against the upper dir as one scan found it: its plan, with
// the scan and the target's view that the writes and the reindex need. Its roots are the
// caller's.
type worked struct {
	pos    int
	fds    rollbackRoots
	res    *scanResult
	target map[string]*Entry
	v      *view
	pl     *plan
}

// close closes what the worked rollback holds open but its roots.
func (w *worked) close() {
	if w.pl != nil {
		w.pl.close()
	}
	if w.v != nil {
		w.v.close()
	}
	if w.res != nil {
		w.res.closeDirs() // those not handed to the plan
	}
}

// workOut scans the upper dir and plans the rollback to req.Target: everything up to the
// first write, every content needed read or opened and checked.
func (s *Store) workOut(ctx context.Context, req RollbackRequest, fds rollbackRoots, ph *rollbackPhases) (*worked, error) {
	pos, err := s.lookup(req.Target)
	if err != nil {
		return nil, err
	}
	w := &worked{pos: pos, fds: fds}
	if w.res, err = s.scanOpen(ctx, fds.upper, req.Upper, false, req.Open); err != nil {
		return nil, fmt.Errorf("scan upper dir: %w", err)
	}
	ph.scanned = time.Now()
	w.target = s.state
	if pos != s.headPos() {
		w.target = s.foldState(pos)
	}
	if w.v, err = newView(w.target, req.Lower); err != nil {
		w.close()
		return nil, err
	}
	w.v.ids = s.opts.ids
	upperDirs := w.res.upperDirs // the scan's, for the plan and the reindex: the plan closes them
	w.res.upperDirs = nil
	if w.pl, err = s.plan(w.v, fds, s.changedBetween(pos, w.target, w.res), upperDirs); err != nil {
		w.close()
		return nil, err
	}
	ph.planned = time.Now()
	return w, nil
}

// applyWorked writes a worked-out rollback through the merged mount and makes its target the
// head (see Rollback).
func (s *Store) applyWorked(w *worked, meta []byte, deferred bool, beforeWrite func() error, ph *rollbackPhases) (*RollbackResult, error) {
	if beforeWrite != nil {
		if err := beforeWrite(); err != nil {
			return nil, err
		}
	}
	ph.writing = time.Now()
	if err := w.pl.apply(w.fds.merged); err != nil {
		return nil, err
	}
	if err := restoreRoot(w.fds, s.foldRoot(w.pos)); err != nil {
		return nil, err
	}
	ph.written = time.Now()
	if err := s.finishRollback(w.pos, w.fds.upper, w.res, w.pl, w.target, meta, deferred); err != nil {
		return nil, err
	}
	if s.trk != nil { // the next capture checks the rewritten paths again, events or not
		touched := make([]string, 0, len(w.pl.touched))
		for p := range w.pl.touched {
			touched = append(touched, p)
		}
		s.trk.touch(touched)
	}
	return &RollbackResult{FilesRestored: len(w.pl.done), Paths: w.pl.done}, nil
}

// restoreRoot gives the merged tree's root its metadata of the target (last: restoring the
// entries moved its mtime) when it differs, and moves the store's record of it.
func restoreRoot(fds rollbackRoots, want *Entry) error {
	if want == nil {
		return nil // recorded by a version that did not capture the root
	}
	var st unix.Stat_t
	if err := unix.Fstat(fds.merged, &st); err != nil {
		return fmt.Errorf("stat merged root: %w", err)
	}
	have, err := describeRoot(fds.merged, &st)
	if err != nil {
		return err
	}
	if sameMeta(have, want) {
		return nil
	}
	if err := setAttrs(fds.merged, ".", want, true); err != nil {
		return fmt.Errorf("restore the root directory: %w", err)
	}
	return nil
}

// rollbackRoots are the open roots of one rollback.
type rollbackRoots struct{ merged, upper int }

func (r rollbackRoots) close() {
	unix.Close(r.merged)
	unix.Close(r.upper)
}

// openRollbackRoots opens the merged and upper roots and checks that merged is an overlay.
func openRollbackRoots(req RollbackRequest) (rollbackRoots, error) {
	if req.Merged == "" || req.Upper == "" {
		return rollbackRoots{}, fmt.Errorf("merged and upper dirs are required: %w", errdefs.ErrInvalidArgument)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(req.Merged, &sfs); err != nil {
		return rollbackRoots{}, fmt.Errorf("statfs %s: %w", req.Merged, err)
	}
	if sfs.Type != unix.OVERLAYFS_SUPER_MAGIC {
		return rollbackRoots{}, fmt.Errorf("%s is not an overlay mount: %w", req.Merged, errdefs.ErrFailedPrecondition)
	}
	m, err := openRoot(req.Merged)
	if err != nil {
		return rollbackRoots{}, err
	}
	u, err := openRoot(req.Upper)
	if err != nil {
		unix.Close(m)
		return rollbackRoots{}, err
	}
	return rollbackRoots{merged: m, upper: u}, nil
}

// changedBetween returns every path (but the runtime's mount points) that may differ between
// the upper dir now and the target at chain position pos: the paths recorded by the checkpoints from the head up to
// the common ancestor and down to the target, and those changed in the upper dir since the
// head. A self-contained checkpoint on the way records no "gone" entries, so then every path
// of the head's and the target's state counts as changed.
func (s *Store) changedBetween(pos int, target map[string]*Entry, res *scanResult) map[string]bool {
	set := map[string]bool{}
	up, down := s.pathBetween(s.headPos(), pos)
	for _, i := range append(up, down...) {
		m := s.chain[i]
		for _, e := range m.Entries {
			set[e.Path] = true
		}
		if m.Full {
			for p := range target {
				set[p] = true
			}
			for p := range s.state {
				set[p] = true
			}
		}
	}
	for _, c := range res.changed {
		set[c.entry.Path] = true
	}
	for _, p := range res.gone {
		set[p] = true
	}
	// The runtime's mount points (DefaultVerifySkip: .deltabox with its read-only SDK and
	// run dir, proc, sys, dev) show their mounts in the merged tree, not the overlay: never
	// restored (a read-only bind mount cannot be, and need not be).
	for p := range set {
		if underAny(p, DefaultVerifySkip()) {
			delete(set, p)
		}
	}
	return set
}

// finishRollback moves the index to the new upper dir and records the rollback, which makes
// the target the head (durable once renamed and its directory fsynced: a crash before leaves
// the old head, and the next capture records the rewritten paths again). Deferred, the record
// is only kept in memory, for PersistRollback.
func (s *Store) finishRollback(pos, upperfd int, res *scanResult, pl *plan, target map[string]*Entry, meta []byte, deferred bool) error {
	s.idx.apply(res)
	s.reindex(upperfd, pl, target)
	rec := &rollbackRecord{Nonce: nonce(), Target: s.chain[pos].ID, Index: s.indexDelta(pos, res, pl), Meta: meta}
	if !deferred {
		if err := s.writeRollback(rec); err != nil {
			return err
		}
	}
	s.unwritten = deferred
	s.pending = rec
	s.head = rec.Target
	s.state = target
	s.root = s.foldRoot(pos)
	var st unix.Stat_t
	if unix.Fstat(upperfd, &st) == nil {
		s.rootKey = keyOf(&st)
	} else {
		s.rootKey = Key{} // unknown: the next capture describes the root again
	}
	return nil
}

// writeRollback writes a rollback record durably: temp file, fdatasync, rename, dir fsync.
func (s *Store) writeRollback(rec *rollbackRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := s.tempFile()
	if err != nil {
		return fmt.Errorf("record rollback: %w", err)
	}
	if err := writeFileRenamed(f, filepath.Join(s.dir, rollbackFile), data, s.opts.sync); err != nil {
		return fmt.Errorf("record rollback: %w", err)
	}
	if s.opts.sync {
		if err := syncDir(s.dir); err != nil {
			return fmt.Errorf("record rollback: %w", err)
		}
	}
	return nil
}

// PersistRollback makes the record of a Deferred rollback durable: it writes it (temp file,
// fdatasync, rename, directory fsync), or, when WriteRollback already put it in place,
// syncs it (nothing when there is none). Once it returns, a crash (power loss included)
// leaves the rollback's target the head. A failure keeps the record in memory; the call
// can be retried.
func (s *Store) PersistRollback() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.prepareTemp()
	return s.persistRollback()
}

// persistRollback is PersistRollback with s.mu held.
func (s *Store) persistRollback() error {
	if s.unsynced {
		if err := s.syncRollback(); err != nil {
			return err
		}
		s.unsynced = false
	}
	if !s.unwritten || s.pending == nil {
		return nil
	}
	if err := s.writeRollback(s.pending); err != nil {
		return err
	}
	s.unwritten = false
	return nil
}

// WriteRollback puts the record of a Deferred rollback in place without syncing it (temp
// file, rename): the page cache holds it, so a killed process (not the machine) finds the
// target as the head at the next open. PersistRollback (or the next Capture, Delete or
// Rollback) then makes it durable. A power loss before that may find the old record, or,
// where the file system orders the rename before the data, none that decodes, which open
// ignores (loadRollback): the caller's intent, durable before the rollback began, must
// then redo the rollback.
func (s *Store) WriteRollback() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.prepareTemp()
	if !s.unwritten || s.pending == nil {
		return nil
	}
	data, err := json.Marshal(s.pending)
	if err != nil {
		return err
	}
	f, err := s.tempFile()
	if err != nil {
		return fmt.Errorf("record rollback: %w", err)
	}
	if err := writeFileRenamed(f, filepath.Join(s.dir, rollbackFile), data, false); err != nil {
		return fmt.Errorf("record rollback: %w", err)
	}
	s.unwritten, s.unsynced = false, s.opts.sync
	return nil
}

// SyncRollback makes the rollback record found on disk durable (fdatasync, directory
// fsync): after a restart, for a record an earlier process wrote with WriteRollback.
func (s *Store) SyncRollback() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.syncRollback(); err != nil {
		return err
	}
	s.unsynced = false
	return nil
}

// syncRollback syncs the record file, if any, and the store's directory.
func (s *Store) syncRollback() error {
	if !s.opts.sync {
		return nil
	}
	fd, err := unix.Open(filepath.Join(s.dir, rollbackFile), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Fdatasync(fd)
		unix.Close(fd)
	} else if errors.Is(err, unix.ENOENT) {
		err = nil // absorbed by a capture since: its manifest is durable
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		return fmt.Errorf("sync rollback record: %w", err)
	}
	return nil
}

// reindex brings the index entries of every path the rollback wrote up to date. Where the
// upper dir now holds exactly what the target recorded for the path (same kind, and for a
// directory the same opaque flag: the content, mode, owner, mtime and xattrs were just
// written from that record; for a hard-linked file, the same inode identity), the new stat
// key is taken, so the path does not count as changed again. Elsewhere the merged view is back at the target but the upper dir represents
// it differently (a lower file restored as an upper copy, a directory that stays opaque
// because overlayfs cannot clear the flag through the merged mount); those entries are
// invalidated so the next capture records them as they are, since hiding the difference
// would let a later capture of, say, the opaque parent lose the copies.
func (s *Store) reindex(upperfd int, pl *plan, target map[string]*Entry) {
	dirs := pl.udirs // the plan's, without the directories its removals replaced
	if dirs == nil || dirs.root != upperfd {
		dirs = newDirCache(upperfd)
		defer dirs.close()
	}
	for p := range pl.touched {
		e := target[p]
		st, err := dirs.lstat(p)
		switch {
		case err == nil && st == nil && e == nil:
			s.idx.del(p)
		case err == nil && st != nil && e != nil && e.Kind == kindOf(st) &&
			(e.Kind != KindDir || dirs.opaque(p) == e.Opaque) && sameLink(upperfd, p, e, st):
			s.idx.set(p, &idxEntry{key: keyOf(st), gen: s.idx.gen})
		default:
			s.idx.set(p, &idxEntry{gen: s.idx.gen}) // never matches: recorded next time
		}
	}
}

// sameLink reports whether the upper path p (stat st) has the hard-link identity e records. A
// rollback that recreates a hard-linked file makes a new inode, so the group's recorded
// identity no longer matches it; its paths must be recorded again, or a path linked to it
// later would be captured under the new identity while the others keep the old one.
func sameLink(upperfd int, p string, e *Entry, st *unix.Stat_t) bool {
	if e.Kind == KindDir || st.Nlink <= 1 {
		return e.Link == ""
	}
	if e.Link == "" {
		return false
	}
	pfd, _, err := openParent(upperfd, p)
	if err != nil {
		return false
	}
	defer unix.Close(pfd)
	return linkID(pfd, p, st) == e.Link
}

// indexDelta returns how the live index differs from the index persisted at chain position
// pos. Unless a checkpoint between the head and pos is self-contained (its index may differ
// anywhere), only paths named by the index of a checkpoint on the way, the pending rollback,
// this rollback's scan or its writes can differ, so only those are compared.
func (s *Store) indexDelta(pos int, res *scanResult, pl *plan) map[string]*Key {
	cand := map[string]bool{}
	up, down := s.pathBetween(s.headPos(), pos)
	for _, i := range append(up, down...) {
		m := s.chain[i]
		if m.Full {
			return s.fullIndexDelta(pos)
		}
		for p := range m.Index {
			cand[p] = true
		}
	}
	if s.pending != nil {
		for p := range s.pending.Index {
			cand[p] = true
		}
	}
	for _, c := range res.changed {
		cand[c.entry.Path] = true
	}
	for _, p := range res.gone {
		cand[p] = true
	}
	for p := range pl.touched {
		cand[p] = true
	}
	delta := map[string]*Key{}
	anc := s.ancestry(pos) // once: each step of it looks a parent up in the chain
	for p := range cand {
		s.addDelta(delta, p, s.keyIn(anc, p))
	}
	return delta
}

// fullIndexDelta compares the whole live index with the index folded at pos.
func (s *Store) fullIndexDelta(pos int) map[string]*Key {
	base := s.foldIndex(pos)
	delta := map[string]*Key{}
	for p := range s.idx.keys {
		s.addDelta(delta, p, base[p])
	}
	for p, k := range base {
		if s.idx.keys[p] == nil {
			s.addDelta(delta, p, k)
		}
	}
	return delta
}

// addDelta records p in delta if its live key differs from the persisted one.
func (s *Store) addDelta(delta map[string]*Key, p string, persisted *Key) {
	ie := s.idx.keys[p]
	switch {
	case ie == nil && persisted != nil:
		delta[p] = nil
	case ie != nil && (persisted == nil || *persisted != ie.key):
		key := ie.key
		delta[p] = &key
	}
}

// keyIn returns p's persisted index key at the chain position whose ancestry is anc (nil
// when not indexed).
func (s *Store) keyIn(anc []int, p string) *Key {
	for j := len(anc) - 1; j >= 0; j-- {
		if k, ok := s.chain[anc[j]].Index[p]; ok {
			return k
		}
	}
	return nil
}

// nonce returns a random identifier for a rollback record.
func nonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sortDeepestFirst orders paths children before parents.
func sortDeepestFirst(paths []string) {
	sort.Slice(paths, func(i, j int) bool {
		di, dj := depth(paths[i]), depth(paths[j])
		if di != dj {
			return di > dj
		}
		return paths[i] < paths[j]
	})
}
