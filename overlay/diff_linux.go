//go:build linux

package overlay

import (
	"context"
	"fmt"
	"maps"
	"sort"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Diff lists the paths of the merged tree that differ between checkpoints from and to
// (to == "" means the upper dir as it is now, uncaptured changes included), with sizes.
// Directories count as modified when their own attributes changed.
func (s *Store) Diff(ctx context.Context, from, to string) ([]DiffEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, err := s.diff(ctx, from, to)
	if err != nil {
		return nil, fmt.Errorf("diff %s..%s: %w", from, to, err)
	}
	return out, nil
}

func (s *Store) diff(ctx context.Context, from, to string) ([]DiffEntry, error) {
	pf, err := s.lookup(from)
	if err != nil {
		return nil, err
	}
	a := s.foldState(pf)
	b, err := s.stateOf(ctx, to)
	if err != nil {
		return nil, err
	}
	lowers := s.chain[len(s.chain)-1].Lower
	va, err := newView(a, lowers)
	if err != nil {
		return nil, err
	}
	defer va.close()
	vb, err := newView(b, lowers)
	if err != nil {
		return nil, err
	}
	defer vb.close()
	var out []DiffEntry
	rb, err := s.rootOf(to)
	if err != nil {
		return nil, err
	}
	if ra := s.foldRoot(pf); ra != nil && rb != nil && !sameMeta(ra, rb) {
		out = append(out, DiffEntry{Path: ".", Change: Modified, Kind: KindDir})
	}
	for _, p := range differingPaths(a, b) {
		d, err := classify(va, vb, p)
		if err != nil {
			return nil, err
		}
		if d != nil {
			out = append(out, *d)
		}
	}
	return out, nil
}

// rootOf returns the upper dir's own metadata at checkpoint id, or ("") now.
func (s *Store) rootOf(id string) (*Entry, error) {
	if id != "" {
		pos, err := s.lookup(id)
		if err != nil {
			return nil, err
		}
		return s.foldRoot(pos), nil
	}
	fd, err := openRoot(s.chain[len(s.chain)-1].Upper)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat upper root: %w", err)
	}
	return describeRoot(fd, &st)
}

// stateOf returns the upper state at checkpoint id, or ("") the upper dir now.
func (s *Store) stateOf(ctx context.Context, id string) (map[string]*Entry, error) {
	if id != "" {
		pos, err := s.lookup(id)
		if err != nil {
			return nil, err
		}
		return s.foldState(pos), nil
	}
	latest := s.chain[len(s.chain)-1]
	if latest.Upper == "" {
		return nil, fmt.Errorf("upper dir unknown: %w", errdefs.ErrFailedPrecondition)
	}
	fd, err := openRoot(latest.Upper)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	res, err := s.scan(ctx, fd, latest.Upper, false, OpenFiles{})
	if err != nil {
		return nil, err
	}
	st := maps.Clone(s.state)
	for _, c := range res.changed {
		st[c.entry.Path] = c.entry
	}
	for _, p := range res.gone {
		delete(st, p)
	}
	return st, nil
}

// differingPaths lists, parents first, the paths whose upper entries differ.
func differingPaths(a, b map[string]*Entry) []string {
	var out []string
	for p, ea := range a {
		if !sameEntry(ea, b[p]) {
			out = append(out, p)
		}
	}
	for p := range b {
		if a[p] == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return pathLess(out[i], out[j]) })
	return out
}

// sameEntry compares two recorded states of a path (content by where it is stored).
func sameEntry(a, b *Entry) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	return a.Kind == b.Kind && a.Mode == b.Mode && a.UID == b.UID && a.GID == b.GID &&
		a.Mtime == b.Mtime && a.Size == b.Size && a.Rdev == b.Rdev && a.Target == b.Target &&
		a.Opaque == b.Opaque && sameXattrs(a.Xattrs, b.Xattrs) &&
		a.ckpt == b.ckpt && a.Off == b.Off && a.ckpt != ""
}

// classify compares p in two merged views.
func classify(va, vb *view, p string) (*DiffEntry, error) {
	a, err := va.lookup(p)
	if err != nil {
		return nil, err
	}
	b, err := vb.lookup(p)
	if err != nil {
		return nil, err
	}
	switch {
	case a == nil && b == nil:
		return nil, nil
	case a == nil:
		return &DiffEntry{Path: p, Change: Added, Kind: b.Kind, Size: b.Size}, nil
	case b == nil:
		return &DiffEntry{Path: p, Change: Deleted, Kind: a.Kind, Size: a.Size}, nil
	case sameEntry(a, b):
		return nil, nil
	}
	return &DiffEntry{Path: p, Change: Modified, Kind: b.Kind, Size: b.Size}, nil
}
