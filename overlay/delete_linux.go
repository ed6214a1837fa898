//go:build linux

package overlay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// Delete removes checkpoint id. A checkpoint with one child is folded into it: the child
// absorbs what id recorded that it does not override (contents included), becoming
// self-contained if id was, so every checkpoint below stays restorable. A leaf goes with
// nothing else changed; deleting the head (only as a leaf) makes its parent the head, and the
// next L1 capture then records everything changed since that parent. A checkpoint with more
// than one child (a branch point) cannot be deleted (errdefs.ErrFailedPrecondition).
// merge, when given, computes the record (Meta) the child keeps from the deleted
// checkpoint's and its own.
func (s *Store) Delete(ctx context.Context, id string, merge ...MetaMerge) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.prepareTemp()
	if err := s.persistRollback(); err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	pos, err := s.lookup(id)
	if err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	kids := s.children(id)
	switch {
	case len(kids) > 1:
		err = fmt.Errorf("it has %d children: %w", len(kids), errdefs.ErrFailedPrecondition)
	case len(kids) == 1 && id == s.head:
		err = fmt.Errorf("it is the head and has a child: %w", errdefs.ErrFailedPrecondition)
	case len(kids) == 0:
		err = s.deleteLeaf(pos)
	default:
		var mm MetaMerge
		if len(merge) > 0 {
			mm = merge[0]
		}
		err = s.deleteInner(pos, kids[0], mm)
	}
	if err != nil {
		return fmt.Errorf("delete checkpoint %s: %w", id, err)
	}
	log.L(ctx).Debug("overlay checkpoint deleted", "checkpoint", id)
	return nil
}

// MetaMerge returns the record a child keeps when its parent is folded into it by Delete.
type MetaMerge func(parent, child []byte) ([]byte, error)

// Children returns the checkpoints whose parent is id, in capture order.
func (s *Store) Children(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range s.children(id) {
		out = append(out, s.chain[p].ID)
	}
	return out
}

// children returns the chain positions of id's children.
func (s *Store) children(id string) []int {
	var out []int
	for i, m := range s.chain {
		if m.Parent == id {
			out = append(out, i)
		}
	}
	return out
}

// deleteLeaf drops a checkpoint without children; if it is the head, its parent becomes the
// head and the state is rebuilt.
func (s *Store) deleteLeaf(pos int) error {
	m := s.chain[pos]
	if err := s.removePack(m.ID); err != nil {
		return err
	}
	s.chain = append(s.chain[:pos], s.chain[pos+1:]...)
	if s.opts.sync {
		if err := syncDir(s.dir); err != nil {
			return err
		}
	}
	if m.ID != s.head {
		return nil
	}
	if s.pending != nil {
		if err := os.Remove(filepath.Join(s.dir, rollbackFile)); err != nil && !os.IsNotExist(err) {
			return err
		}
		s.pending = nil
	}
	s.head = m.Parent
	return s.rebuild()
}

// deleteInner folds checkpoint pos into its only child (at chain position kid), rewriting the
// child's pack, then removes pos. A crash in between leaves both packs; load drops the
// absorbed one (the child names it).
func (s *Store) deleteInner(pos, kid int, merge MetaMerge) error {
	old, next := s.chain[pos], s.chain[kid]
	m := mergeManifests(old, next)
	if merge != nil {
		meta, err := merge(old.Meta, next.Meta)
		if err != nil {
			return fmt.Errorf("merge records: %w", err)
		}
		m.Meta = meta
	}
	f, err := s.tempFile()
	if err != nil {
		return fmt.Errorf("create pack: %w", err)
	}
	pw := newPackWriter(f, s.opts.reflink, s.opts.sync)
	if err := s.copyContents(pw, m); err != nil {
		pw.abort()
		return err
	}
	if err := pw.commit(m, filepath.Join(s.dir, m.ID+packSuffix)); err != nil {
		pw.abort()
		return err
	}
	if f := s.packs[next.ID]; f != nil {
		f.Close()
	}
	s.packs[next.ID] = pw.file()
	s.chain[kid] = m
	if err := s.removePack(old.ID); err != nil {
		return err
	}
	s.chain = append(s.chain[:pos], s.chain[pos+1:]...)
	if s.opts.sync {
		if err := syncDir(s.dir); err != nil {
			return err
		}
	}
	h := s.headPos()
	s.state, s.root = s.foldState(h), s.foldRoot(h)
	return nil
}

// mergeManifests returns next with old folded in underneath (entries are copied, and their
// contents must be copied into the new pack by copyContents).
func mergeManifests(old, next *manifest) *manifest {
	m := *next
	m.Parent, m.Full, m.Absorbed = old.Parent, old.Full || next.Full, old.ID
	m.Version = manifestVer // copyContents gives every entry with content a digest
	if m.Root == nil {
		m.Root = old.Root
	}
	entries := map[string]*Entry{}
	if !next.Full {
		for _, e := range old.Entries {
			entries[e.Path] = e
		}
	}
	for _, e := range next.Entries {
		entries[e.Path] = e
	}
	m.Entries = nil
	for _, e := range entries {
		c := *e
		m.Entries = append(m.Entries, &c)
	}
	sort.Slice(m.Entries, func(i, j int) bool { return pathLess(m.Entries[i].Path, m.Entries[j].Path) })
	m.Index = map[string]*Key{}
	if !next.Full {
		applyPending(m.Index, old.Index)
	}
	applyPending(m.Index, next.Index)
	if m.Full {
		for p, k := range m.Index {
			if k == nil {
				delete(m.Index, p)
			}
		}
	}
	return &m
}

// copyContents copies every content extent m's entries reference into pw (once per extent)
// and points the entries at their new offsets.
func (s *Store) copyContents(pw *packWriter, m *manifest) error {
	type extent struct {
		ckpt string
		off  int64
	}
	moved := map[extent]movedExtent{}
	for _, e := range m.Entries {
		if e.Kind != KindFile || e.Size == 0 {
			e.ckpt = m.ID
			continue
		}
		src := extent{e.ckpt, e.Off}
		dst, ok := moved[src]
		if !ok {
			var err error
			if dst, err = s.moveContent(pw, e); err != nil {
				return err
			}
			moved[src] = dst
		}
		e.ckpt, e.Off, e.Sum, e.summed = m.ID, dst.off, dst.sum, true
	}
	return nil
}

// movedExtent is where copyContents put one content extent, and its digest.
type movedExtent struct {
	off int64
	sum uint64
}

// moveContent copies e's content into pw. Content with a recorded digest must still have it:
// damage is refused, never carried into the merged pack under a fresh digest.
func (s *Store) moveContent(pw *packWriter, e *Entry) (movedExtent, error) {
	f := s.packs[e.ckpt]
	if f == nil {
		return movedExtent{}, fmt.Errorf("content of %q: checkpoint %s not open", e.Path, e.ckpt)
	}
	if err := checkExtent(f, e); err != nil {
		return movedExtent{}, err
	}
	off, sum, err := pw.addFrom(int(f.Fd()), e.Off, e.Size)
	if err != nil {
		return movedExtent{}, err
	}
	if e.summed && sum != e.Sum {
		return movedExtent{}, &DamageError{Checkpoint: e.ckpt, Path: e.Path,
			Reason: fmt.Sprintf("xxh3 %016x, recorded %016x", sum, e.Sum)}
	}
	return movedExtent{off: off, sum: sum}, nil
}
