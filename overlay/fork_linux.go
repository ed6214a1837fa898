//go:build linux

package overlay

import (
	"context"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// RestoreInto makes another sandbox's merged tree equal checkpoint id's, as Rollback does for
// this store's own sandbox, without changing this store: req names the other sandbox's merged
// mount, upper and lower dirs (the same image: its lower layers are those of the checkpoint).
// Only the paths of the checkpoint's upper state and the paths in the other upper dir are
// visited, so the image is never copied. Writes go through the other merged mount, never
// following a symlink; content from this store's packs is checked against its digest first.
func (s *Store) RestoreInto(ctx context.Context, id string, req RollbackRequest) (*RollbackResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pos, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	fds, err := openRollbackRoots(req)
	if err != nil {
		return nil, err
	}
	defer fds.close()
	to := idShift{}
	if req.IDs != nil {
		to = idShift{req.IDs.Host, req.IDs.Size}
	}
	target := s.opts.ids.moveTo(to, s.stateAt(pos))
	changed := make(map[string]bool, len(target))
	for p := range target {
		changed[p] = true
	}
	if err := walkNames(fds.upper, "", changed); err != nil {
		return nil, fmt.Errorf("walk the upper dir: %w", err)
	}
	// The runtime's own mount points (DefaultVerifySkip: .deltabox, proc, sys, dev) are
	// made by each sandbox's runtime, and may be read-only bind mounts: left alone.
	for p := range changed {
		if underAny(p, DefaultVerifySkip()) {
			delete(changed, p)
		}
	}
	v, err := newView(target, req.Lower)
	if err != nil {
		return nil, err
	}
	defer v.close()
	v.ids = to
	pl, err := s.plan(v, fds, changed, nil)
	if err != nil {
		return nil, err
	}
	defer pl.close()
	if err := pl.apply(fds.merged); err != nil {
		return nil, err
	}
	if err := restoreRoot(fds, s.foldRoot(pos)); err != nil {
		return nil, err
	}
	return &RollbackResult{FilesRestored: len(pl.done), Paths: pl.done}, nil
}

// moveTo returns st with the owners in m's host range moved into to's (copies of the entries
// that change; unchanged when both are the same).
func (m idShift) moveTo(to idShift, st map[string]*Entry) map[string]*Entry {
	if m == to {
		return st
	}
	move := func(id uint32) uint32 {
		switch {
		case m.size > 0 && id >= m.host && id-m.host < m.size:
			id -= m.host
		case m.size > 0:
			return id // outside the source's range: an id the sandbox could not own
		}
		if to.size > 0 && id < to.size {
			return id + to.host
		}
		return id
	}
	out := make(map[string]*Entry, len(st))
	for p, e := range st {
		c := *e
		c.UID, c.GID = move(e.UID), move(e.GID)
		out[p] = &c
	}
	return out
}

// underAny reports whether path p is one of roots or below one.
func underAny(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// walkNames adds every path under directory rel of root (an upper dir) to set, never
// following a symlink.
func walkNames(root int, rel string, set map[string]bool) error {
	var fd int
	var err error
	if rel == "" { // the root fd may be an O_PATH one
		fd, err = unix.Openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	} else {
		fd, err = openBeneath(root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := joinPath(rel, n)
		set[p] = true
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if err := walkNames(root, p, set); err != nil {
				return err
			}
		}
	}
	return nil
}
