//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// Folding a checkpoint into its child rewrites the child's pack with everything the folded
// one recorded that the child does not override. When the folded checkpoint is big (the
// first full capture of a sandbox with thousands of files) that is tens of milliseconds of
// merging, copying, encoding and syncing, and retention folds at every checkpoint past its
// bound. So a fold is prepared without holding the store (PrepareFold: the checkpoints
// merged are immutable, their packs are read through descriptors of its own) and only
// installed under it (PreparedFold.Commit: a check, a rename and the swap in memory); the
// directory sync and the removal of the folded packs follow after the store is released
// (Finish). Until Finish, a crash leaves the folded packs beside the merged one, which load
// drops (the merged pack names them).

// PreparedFold is a fold of checkpoints into their child, its merged pack written and synced
// under a temp name (PrepareFold).
type PreparedFold struct {
	s       *Store
	compact bool        // PrepareCompact: the layers above stay, the last one becomes full
	layers  []*manifest // as prepared: the folded checkpoints top down, then the child
	m       *manifest   // the child as merged
	pw      *packWriter // m's pack, not yet renamed into place
	gone    []string    // after Commit: the folded packs' paths, removed by Finish
	// retired are the replaced packs' descriptors, closed by Finish: closing the last
	// descriptor of the child's old pack (renamed over) frees its blocks, ~0.3 ms here.
	retired []*os.File
}

// PrepareFold works out Delete of ids, a path of the tree top down (each the only child of
// the one before), all folded into the only child of the last, without holding the store
// for the work: the merged pack is written and synced beside the store's packs. merge, when
// given, combines the records as Delete's does, in order. Nothing visible changes until
// Commit; Abort (or a Commit that finds the tree changed) removes the pack.
func (s *Store) PrepareFold(ctx context.Context, ids []string, merge MetaMerge) (*PreparedFold, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("fold: no checkpoint named: %w", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	layers, srcs, reflink, err := s.foldSources(ids)
	s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("fold checkpoint %s: %w", ids[0], err)
	}
	defer func() {
		for _, f := range srcs {
			f.Close()
		}
	}()
	p := &PreparedFold{s: s, layers: layers}
	if err := p.write(srcs, reflink, merge); err != nil {
		return nil, fmt.Errorf("fold checkpoint %s: %w", ids[0], err)
	}
	log.L(ctx).Debug("overlay fold prepared", "checkpoints", ids, "into", p.m.ID, "entries", len(p.m.Entries))
	return p, nil
}

// foldSources checks that ids can be folded now and returns their manifests (then the
// child's) with descriptors of their packs of the fold's own, and whether the pack may clone.
// Callers hold s.mu.
func (s *Store) foldSources(ids []string) ([]*manifest, map[string]*os.File, bool, error) {
	layers, err := s.foldLayers(ids)
	if err != nil {
		return nil, nil, false, err
	}
	srcs, reflink, err := s.dupPacks(layers)
	return layers, srcs, reflink, err
}

// dupPacks returns descriptors of the layers' packs of the caller's own, and whether a new
// pack may clone extents. Callers hold s.mu.
func (s *Store) dupPacks(layers []*manifest) (map[string]*os.File, bool, error) {
	var err error
	srcs := map[string]*os.File{}
	for _, l := range layers {
		f := s.packs[l.ID]
		if f == nil {
			err = fmt.Errorf("checkpoint %s not open", l.ID)
			break
		}
		fd, derr := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if derr != nil {
			err = fmt.Errorf("checkpoint %s: %w", l.ID, derr)
			break
		}
		srcs[l.ID] = os.NewFile(uintptr(fd), f.Name())
	}
	if err != nil {
		for _, f := range srcs {
			f.Close()
		}
		return nil, false, err
	}
	return srcs, s.opts.reflink && !s.noClone, nil
}

// foldLayers returns the manifests of ids and of the last one's child when they can be
// folded: each exists, is not the head and has one child, the next of ids (the last's is
// the child returned). Callers hold s.mu.
func (s *Store) foldLayers(ids []string) ([]*manifest, error) {
	var layers []*manifest
	for i, id := range ids {
		pos, err := s.lookup(id)
		if err != nil {
			return nil, err
		}
		kids := s.children(id)
		switch {
		case len(kids) != 1:
			return nil, fmt.Errorf("checkpoint %s has %d children: %w", id, len(kids), errdefs.ErrFailedPrecondition)
		case id == s.head:
			return nil, fmt.Errorf("checkpoint %s is the head and has a child: %w", id, errdefs.ErrFailedPrecondition)
		case i+1 < len(ids) && s.chain[kids[0]].ID != ids[i+1]:
			return nil, fmt.Errorf("checkpoint %s is not the child of %s: %w", ids[i+1], id, errdefs.ErrFailedPrecondition)
		}
		layers = append(layers, s.chain[pos])
		if i == len(ids)-1 {
			layers = append(layers, s.chain[kids[0]])
		}
	}
	return layers, nil
}

// write merges p's layers into a new pack (contents copied from srcs), synced, not renamed.
func (p *PreparedFold) write(srcs map[string]*os.File, reflink bool, merge MetaMerge) error {
	m := mergeManifests(p.layers)
	if p.compact { // the last layer, self-contained, in its place in the tree
		last := p.layers[len(p.layers)-1]
		m.Parent, m.Absorbed, m.Folded, m.Full, m.Level = last.Parent, last.Absorbed, last.Folded, true, L2
	}
	if merge != nil {
		meta := p.layers[0].Meta
		for _, l := range p.layers[1:] {
			var err error
			if meta, err = merge(meta, l.Meta); err != nil {
				return fmt.Errorf("merge records: %w", err)
			}
		}
		m.Meta = meta
	}
	f, err := os.CreateTemp(p.s.dir, tempPrefix+"*")
	if err != nil {
		return fmt.Errorf("create pack: %w", err)
	}
	pw := newPackWriter(f, reflink, p.s.opts.sync)
	if err := copyContents(pw, m, srcs); err != nil {
		pw.abort()
		return err
	}
	if err := pw.seal(m); err != nil {
		pw.abort()
		return err
	}
	p.m, p.pw = m, pw
	return nil
}

// Commit installs the prepared fold: the merged pack takes the child's place and the folded
// checkpoints leave the tree. It fails, with nothing changed and the pack removed, when the
// tree changed since PrepareFold in a way the fold depends on (errdefs.ErrFailedPrecondition:
// a folded checkpoint was deleted, became the head or got another child). The fold is
// durable once Finish returns.
func (p *PreparedFold) Commit(ctx context.Context) error {
	s := p.s
	if s == nil || p.pw == nil {
		return fmt.Errorf("fold: already committed or aborted: %w", errdefs.ErrFailedPrecondition)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.prepareTemp()
	return p.commit(ctx)
}

// commit is Commit with s.mu held.
func (p *PreparedFold) commit(ctx context.Context) error {
	s := p.s
	ids := make([]string, len(p.layers)-1)
	for i, l := range p.layers[:len(ids)] {
		ids[i] = l.ID
	}
	fail := func(err error) error {
		p.abort()
		if p.compact {
			return fmt.Errorf("compact checkpoint %s: %w", p.layers[len(p.layers)-1].ID, err)
		}
		return fmt.Errorf("fold checkpoint %s: %w", ids[0], err)
	}
	if err := s.persistRollback(); err != nil {
		return fail(err)
	}
	if err := s.finishFolds(); err != nil {
		return fail(err)
	}
	child := p.layers[len(p.layers)-1]
	var now []*manifest
	var err error
	if p.compact {
		now, err = s.compactLayers(child.ID)
	} else {
		now, err = s.foldLayers(ids)
	}
	if errdefs.IsNotFound(err) { // deleted meanwhile
		err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if err == nil && !slices.Equal(now, p.layers) {
		err = fmt.Errorf("the checkpoints changed since the fold was prepared: %w", errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return fail(err)
	}
	if s.packs[child.ID] == nil {
		return fail(fmt.Errorf("store closed: %w", errdefs.ErrFailedPrecondition))
	}
	if p.pw.cloneFailed {
		s.noClone = true
	}
	if err := os.Rename(p.pw.f.Name(), filepath.Join(s.dir, child.ID+packSuffix)); err != nil {
		return fail(fmt.Errorf("rename pack: %w", err))
	}
	p.pw.done = true
	p.retired = append(p.retired, s.packs[child.ID])
	s.packs[child.ID] = p.pw.f
	s.chain[s.position(child.ID)] = p.m
	for _, id := range ids {
		if p.compact {
			break
		}
		if f := s.packs[id]; f != nil {
			p.retired = append(p.retired, f)
			delete(s.packs, id)
		}
		p.gone = append(p.gone, filepath.Join(s.dir, id+packSuffix))
	}
	s.unfinished = append(s.unfinished, p.gone...)
	if !p.compact {
		s.chain = slices.DeleteFunc(s.chain, func(m *manifest) bool { return slices.Contains(ids, m.ID) })
	}
	s.root = s.foldRoot(s.headPos())
	// Where the head descends from the merged checkpoint, its state names the merged
	// entries for the paths that come from the merged layers (each merged entry is the
	// latest of them, moved into the new pack); the rest stays.
	if s.descends(s.headPos(), child.ID) {
		for _, e := range p.m.Entries {
			if cur := s.state[e.Path]; cur != nil && slices.ContainsFunc(p.layers, func(l *manifest) bool { return l.ID == cur.ckpt }) {
				s.state[e.Path] = e
			}
		}
	}
	p.pw = nil
	log.L(ctx).Debug("overlay checkpoints folded", "checkpoints", ids, "into", child.ID)
	return nil
}

// Finish makes a committed fold durable (the directory synced) and removes the folded
// packs. It needs no lock; before it, a crash leaves them, which load drops.
func (p *PreparedFold) Finish() error {
	p.closeRetired()
	if len(p.gone) == 0 {
		return nil
	}
	if p.s.opts.sync {
		if err := syncDir(p.s.dir); err != nil {
			return fmt.Errorf("fold: %w", err)
		}
	}
	err := removeAll(p.gone)
	if err == nil {
		s := p.s
		s.mu.Lock()
		s.unfinished = slices.DeleteFunc(s.unfinished, func(path string) bool { return slices.Contains(p.gone, path) })
		s.mu.Unlock()
	}
	p.gone = nil
	return err
}

// closeRetired closes the packs the fold replaced.
func (p *PreparedFold) closeRetired() {
	for _, f := range p.retired {
		f.Close()
	}
	p.retired = nil
}

// finishFolds finishes the committed folds whose Finish has not run (or failed) before the
// tree changes again: once a merged pack is itself folded or deleted, nothing would name
// the packs it absorbed, and load would take them for checkpoints. Callers hold s.mu.
func (s *Store) finishFolds() error {
	if len(s.unfinished) == 0 {
		return nil
	}
	if s.opts.sync {
		if err := syncDir(s.dir); err != nil {
			return fmt.Errorf("finish a fold: %w", err)
		}
	}
	if err := removeAll(s.unfinished); err != nil {
		return fmt.Errorf("finish a fold: %w", err)
	}
	s.unfinished = nil
	return nil
}

// removeAll removes files (those already gone are fine).
func removeAll(paths []string) error {
	var errs []error
	for _, path := range paths {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Abort drops a prepared fold that was not committed.
func (p *PreparedFold) Abort() {
	if p.pw != nil {
		p.abort()
	}
}

func (p *PreparedFold) abort() {
	p.pw.abort()
	p.pw = nil
}

// PrepareCompact works out making checkpoint id self-contained (its pack then holds the
// whole upper dir, merged from it and its ancestors up to the nearest full one, which all
// stay) without holding the store for the work, as PrepareFold does; Commit installs it
// unless that ancestry changed meanwhile. It returns nil when id is self-contained already.
// An automatic L2 is cut as a delta in the frozen window and compacted so after the answer:
// a full capture of 5,000 files froze the sandbox for ~55 ms here.
func (s *Store) PrepareCompact(ctx context.Context, id string) (*PreparedFold, error) {
	s.mu.Lock()
	layers, err := s.compactLayers(id)
	var srcs map[string]*os.File
	reflink := false
	if err == nil && len(layers) > 1 {
		srcs, reflink, err = s.dupPacks(layers)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("compact checkpoint %s: %w", id, err)
	}
	if len(layers) < 2 {
		return nil, nil
	}
	defer func() {
		for _, f := range srcs {
			f.Close()
		}
	}()
	p := &PreparedFold{s: s, compact: true, layers: layers}
	if err := p.write(srcs, reflink, nil); err != nil {
		return nil, fmt.Errorf("compact checkpoint %s: %w", id, err)
	}
	log.L(ctx).Debug("overlay compaction prepared", "checkpoint", id, "layers", len(layers), "entries", len(p.m.Entries))
	return p, nil
}

// compactLayers returns the manifests from id's nearest self-contained ancestor down to id.
// Callers hold s.mu.
func (s *Store) compactLayers(id string) ([]*manifest, error) {
	pos, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	var layers []*manifest
	for _, i := range s.ancestry(pos) {
		layers = append(layers, s.chain[i])
	}
	return layers, nil
}

// descends reports whether the checkpoint at pos is id or below it.
func (s *Store) descends(pos int, id string) bool {
	for p := pos; p >= 0; p = s.position(s.chain[p].Parent) {
		if s.chain[p].ID == id {
			return true
		}
	}
	return false
}

// Entries returns how many entries checkpoint id records (0 when there is none): what
// folding it costs.
func (s *Store) Entries(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pos := s.position(id); pos >= 0 {
		return len(s.chain[pos].Entries)
	}
	return 0
}
