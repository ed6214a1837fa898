//go:build linux

package overlay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	if err := s.finishFolds(); err != nil {
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
		err = s.deleteInner(ctx, pos, kids[0], mm)
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
// child's pack, then removes pos: a fold (fold_linux.go) prepared and installed with the
// store held. A crash in between leaves both packs; load drops the absorbed one (the child
// names it).
func (s *Store) deleteInner(ctx context.Context, pos, kid int, merge MetaMerge) error {
	p := &PreparedFold{s: s, layers: []*manifest{s.chain[pos], s.chain[kid]}}
	if err := p.write(s.packs, s.opts.reflink && !s.noClone, merge); err != nil {
		return err
	}
	if err := p.commit(ctx); err != nil {
		return err
	}
	p.closeRetired()
	return s.finishFolds()
}

// mergeManifests returns the last of layers (a path of the tree top down) with the others
// folded in underneath, in order (entries are copied, and their contents must be copied into
// the new pack by copyContents). A full layer hides the ones above it.
func mergeManifests(layers []*manifest) *manifest {
	next := layers[len(layers)-1]
	m := *next
	m.Parent, m.Version = layers[0].Parent, manifestVer // copyContents gives every entry with content a digest
	m.Absorbed, m.Folded = layers[len(layers)-2].ID, nil
	for _, l := range layers[:len(layers)-2] {
		m.Folded = append(m.Folded, l.ID)
	}
	from := 0
	for i, l := range layers {
		m.Full = m.Full || l.Full
		if l.Full {
			from = i
		}
	}
	for i := len(layers) - 1; m.Root == nil && i >= 0; i-- {
		m.Root = layers[i].Root
	}
	merged := layers[from].Entries
	for _, l := range layers[from+1:] {
		merged = overrideEntries(merged, l.Entries)
	}
	copies := make([]Entry, len(merged))
	m.Entries = make([]*Entry, len(merged))
	for i, e := range merged {
		copies[i] = *e
		m.Entries[i] = &copies[i]
	}
	m.Index = map[string]*Key{}
	for _, l := range layers[from:] {
		applyPending(m.Index, l.Index)
	}
	if m.Full {
		for p, k := range m.Index {
			if k == nil {
				delete(m.Index, p)
			}
		}
	}
	return &m
}

// overrideEntries returns base's entries with top's in their place and added, in pathLess
// order: one pass over both once sorted (a merged pack's entries already are, so folding a
// small delta into a big merged layer does not sort or hash the big one).
func overrideEntries(base, top []*Entry) []*Entry {
	less := func(a, b *Entry) int {
		switch {
		case a.Path == b.Path:
			return 0
		case pathLess(a.Path, b.Path):
			return -1
		}
		return 1
	}
	if !slices.IsSortedFunc(base, less) {
		base = slices.Clone(base)
		slices.SortStableFunc(base, less)
	}
	if !slices.IsSortedFunc(top, less) {
		top = slices.Clone(top)
		slices.SortStableFunc(top, less)
	}
	out := make([]*Entry, 0, len(base)+len(top))
	i, j := 0, 0
	for i < len(base) || j < len(top) {
		switch {
		case j == len(top):
			out = append(out, base[i])
			i++
		case i == len(base):
			out = append(out, top[j])
			j++
		default:
			c := less(base[i], top[j])
			if c <= 0 {
				if c < 0 {
					out = append(out, base[i])
				}
				i++
				continue
			}
			out = append(out, top[j])
			j++
		}
	}
	return dedupLast(out)
}

// dedupLast keeps the last of entries with the same path (a layer names a path once; this
// keeps a damaged one that does not from carrying both).
func dedupLast(es []*Entry) []*Entry {
	out := es[:0]
	for i, e := range es {
		if i+1 < len(es) && es[i+1].Path == e.Path {
			continue
		}
		out = append(out, e)
	}
	return out
}

// copyContents copies every content extent m's entries reference (in packs, by checkpoint)
// into pw (once per extent) and points the entries at their new offsets.
func copyContents(pw *packWriter, m *manifest, packs map[string]*os.File) error {
	if !pw.reflink && bulkCopy {
		return copyContentsBulk(pw, m, packs)
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
			if dst, err = moveContent(pw, e, packs[e.ckpt]); err != nil {
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
func moveContent(pw *packWriter, e *Entry, f *os.File) (movedExtent, error) {
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
func copyContentsBulk(pw *packWriter, m *manifest, packs map[string]*os.File) error {
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
		f := packs[first.ckpt]
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
