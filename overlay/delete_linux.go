//go:build linux

package overlay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/containerd/errdefs"
	"github.com/zeebo/xxh3"

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
	pw := s.newPack(f)
	err = s.copyContents(pw, m)
	s.packWritten(pw)
	if err != nil {
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
	if !pw.reflink && bulkCopy {
		return s.copyContentsBulk(pw, m)
	}
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

// bulkCopy selects copyContentsBulk where extents cannot be cloned (the benchmark compares).
var bulkCopy = true

// Runs of copyContentsBulk: extents of one pack closer than runGap bytes are read and written
// together, up to runMax bytes a run (measured here, BenchmarkDeleteFull: runs of 256 KiB
// merge 5,000 contents of 4 KiB in 35 ms, of 4 MiB in 85 ms, one at a time in 67 ms; the
// buffer stays in the CPU's cache).
const (
	runGap = 4096
	runMax = 256 << 10
)

// copyContentsBulk is copyContents without reflinks: the extents are taken in pack order and
// copied a run of neighbours at a time (one read and one write of up to runMax bytes, the
// few bytes between them included) instead of a read and a write each. Merging a full
// checkpoint of 5,000 small files into its child (retention, at every checkpoint past the
// bound) otherwise makes 15,000 syscalls. Each extent is still checked against its pack's
// size and its recorded digest, from the run's buffer.
func (s *Store) copyContentsBulk(pw *packWriter, m *manifest) error {
	type extent struct {
		ckpt      string
		off, size int64
	}
	users := map[extent][]*Entry{}
	var order []extent
	for _, e := range m.Entries {
		if e.Kind != KindFile || e.Size == 0 {
			e.ckpt = m.ID
			continue
		}
		x := extent{e.ckpt, e.Off, e.Size}
		if users[x] == nil {
			order = append(order, x)
		}
		users[x] = append(users[x], e)
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].ckpt != order[j].ckpt {
			return order[i].ckpt < order[j].ckpt
		}
		return order[i].off < order[j].off
	})
	sizes := map[string]int64{}
	var buf []byte
	h := xxh3.New()
	for i := 0; i < len(order); {
		first := order[i]
		f := s.packs[first.ckpt]
		if f == nil {
			return fmt.Errorf("content of %q: checkpoint %s not open", users[first][0].Path, first.ckpt)
		}
		size, ok := sizes[first.ckpt]
		if !ok {
			st, err := f.Stat()
			if err != nil {
				return err
			}
			size, sizes[first.ckpt] = st.Size(), st.Size()
		}
		// The run: first and the extents after it in the same pack, each starting at or
		// after the end of the one before, at most runGap bytes after it.
		end, j := first.off+first.size, i+1
		for ; j < len(order); j++ {
			x := order[j]
			if x.ckpt != first.ckpt || x.off < end || x.off-end > runGap || x.off+x.size-first.off > runMax {
				break
			}
			end = x.off + x.size
		}
		run := order[i:j]
		for _, x := range run {
			if err := extentInside(users[x][0], size); err != nil {
				return err
			}
		}
		if n := int(end - first.off); cap(buf) < n {
			buf = make([]byte, n)
		}
		data := buf[:end-first.off]
		if err := preadFull(int(f.Fd()), data, first.off); err != nil {
			return fmt.Errorf("read checkpoint %s: %w", first.ckpt, err)
		}
		base := pw.off
		for _, x := range run {
			h.Reset()
			_, _ = h.Write(data[x.off-first.off : x.off-first.off+x.size])
			sum := h.Sum64()
			for _, e := range users[x] {
				if e.summed && sum != e.Sum {
					return &DamageError{Checkpoint: e.ckpt, Path: e.Path,
						Reason: fmt.Sprintf("xxh3 %016x, recorded %016x", sum, e.Sum)}
				}
			}
			for _, e := range users[x] {
				e.ckpt, e.Off, e.Sum, e.summed = m.ID, base+x.off-first.off, sum, true
			}
		}
		if err := pwriteFull(int(pw.f.Fd()), data, base); err != nil {
			return fmt.Errorf("write pack: %w", err)
		}
		pw.off += int64(len(data))
		i = j
	}
	return nil
}
