//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A checkpoint can be handed to other sandboxes as a read-only overlay lower layer instead of
// being copied into each one's upper dir (fork --from): WriteLower materializes the
// checkpoint's full file view (its upper state, the folded layer below included) as a
// directory in overlay format, which the new sandboxes stack between their empty upper dir
// and the image's layers. Such a sandbox's store is opened WithFoldedLower(that dir): the
// layer is part of the sandbox's files, not of its image, so Export and WriteLower of its
// checkpoints fold it back in, while captures, rollbacks, diffs and verifies treat it as the
// lower layer it is.

// LowerRequest asks for a checkpoint as an overlay lower layer.
type LowerRequest struct {
	// Dir is created (it must not exist; its parent must) and filled; it is removed again
	// when WriteLower fails.
	Dir string
	// IDs is the id range the owners are written in: nil writes the sandbox's own ids
	// (0..65535 inside a user namespace), as image layers hold them, for a layer the new
	// sandboxes see through idmapped mounts; otherwise the owners are moved into that host
	// range.
	IDs *IDRange
}

// LowerResult counts what WriteLower wrote.
type LowerResult struct {
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

// WriteLower writes checkpoint id's full upper state (over the image: whiteouts as 0/0
// character devices, opaque directories marked trusted.overlay.opaque=y) into the new
// directory req.Dir, to be used as a read-only overlay lower layer above the image's layers.
// The runtime's own mount points (DefaultVerifySkip) are left out, as RestoreInto leaves them
// alone. A checkpoint holding a device node is refused (failed_precondition): a shared layer
// must not hand one to every fork. Nothing is resolved through a symlink (every parent is
// opened beneath the new directory without following any), and content from the packs is
// checked against its digest before anything is written. Regular files are copied with
// copy_file_range (block clones where the filesystem does them). The directory is not synced.
func (s *Store) WriteLower(ctx context.Context, id string, req LowerRequest) (*LowerResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pos, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	state, err := s.fullState(pos)
	if err != nil {
		return nil, err
	}
	to := idShift{}
	if req.IDs != nil {
		to = idShift{req.IDs.Host, req.IDs.Size}
	}
	// A whiteout that hides nothing of the image (a folded file the sandbox deleted) would
	// show as a stray name in a directory of the layer that is not merged with the image's.
	if state, err = hidingOnly(state, s.exportLowers(s.chain[pos].Lower)); err != nil {
		return nil, err
	}
	state = s.opts.ids.moveTo(to, state)
	out := make(map[string]*Entry, len(state))
	res := &LowerResult{}
	for p, e := range state {
		if underAny(p, DefaultVerifySkip()) {
			continue
		}
		if e.Kind == KindChar || e.Kind == KindBlock {
			return nil, fmt.Errorf("checkpoint %s holds device node /%s: not shared as a layer: %w", id, p, errdefs.ErrFailedPrecondition)
		}
		out[p] = e
		res.Entries++
		if e.Kind == KindFile {
			res.Bytes += e.Size
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := os.Mkdir(req.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create lower layer: %w", err)
	}
	if err := s.materialize(out, req.Dir); err != nil {
		_ = os.RemoveAll(req.Dir)
		return nil, fmt.Errorf("write checkpoint %s as a lower layer: %w", id, err)
	}
	return res, nil
}

// LowerSize estimates the bytes a filesystem with 4 KiB pages needs for WriteLower of
// checkpoint id: each regular file's content rounded up to a page, a page per directory.
func (s *Store) LowerSize(id string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pos, err := s.lookup(id)
	if err != nil {
		return 0, err
	}
	state, err := s.fullState(pos)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range state {
		switch e.Kind {
		case KindFile:
			n += (e.Size + 4095) &^ 4095
		case KindDir:
			n += 4096
		}
	}
	return n, nil
}

// WithFoldedLower says that the store's sandbox has dir as its topmost lower layer and that
// the layer is part of the sandbox's files (a checkpoint of another sandbox written by
// WriteLower), not of its image: Export and WriteLower fold it under each checkpoint's upper
// state. It is read (never written) on first use, without following symlinks.
func WithFoldedLower(dir string) Option {
	return func(o *options) { o.fold = dir }
}

// folded is the state of the folded lower layer, read once.
type folded struct {
	fd   int               // the layer's root (O_PATH)
	base map[string]*Entry // its entries, in overlay upper format, owners as the layer holds them
}

// loadFold reads the folded layer (once).
func (s *Store) loadFold() (*folded, error) {
	if s.opts.fold == "" || s.fold != nil {
		return s.fold, nil
	}
	fd, err := openRoot(s.opts.fold)
	if err != nil {
		return nil, fmt.Errorf("folded lower layer: %w", err)
	}
	f := &folded{fd: fd, base: map[string]*Entry{}}
	if err := walkLayer(fd, "", s.opts.fold, f.base); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("read folded lower layer %s: %w", s.opts.fold, err)
	}
	s.fold = f
	return f, nil
}

// closeFold releases the folded layer's root.
func (s *Store) closeFold() {
	if s.fold != nil {
		unix.Close(s.fold.fd)
		s.fold = nil
	}
}

// walkLayer records every entry under directory rel of a layer (root fd) into out, never
// following a symlink. Content stays in the layer (Entry.lower = dir).
func walkLayer(root int, rel, dir string, out map[string]*Entry) error {
	fd, err := openBeneath(root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
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
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		e, err := describe(fd, p, &st)
		if err != nil {
			return err
		}
		if st.Nlink > 1 && e.Kind != KindDir {
			e.Link = "fold." + linkID(fd, p, &st)
		}
		e.lower = dir
		out[p] = e
		if e.Kind == KindDir {
			if err := walkLayer(root, p, dir, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// fullState is the upper state at pos with the folded layer (if any) below it: the sandbox's
// files relative to its image. The folded entries' owners are moved as the sandbox sees the
// layer (through its idmapped mount, WithLowerIDs), so that they are host ids like the upper's.
func (s *Store) fullState(pos int) (map[string]*Entry, error) {
	st := s.stateAt(pos)
	f, err := s.loadFold()
	if err != nil || f == nil {
		return st, err
	}
	base := make(map[string]*Entry, len(f.base))
	for p, e := range f.base {
		c := *e
		s.opts.ids.apply(&c) // the layer is seen through the sandbox's idmapped mount
		base[p] = &c
	}
	return stackStates(base, st), nil
}

// stackStates returns upper stacked over lower, both upper states in overlay format relative
// to the same layers below, as one upper state with overlayfs's rules: an upper non-directory
// (a whiteout included) hides everything of lower at and under its path, an opaque upper
// directory hides lower's children, and an upper directory over a lower opaque directory or
// non-directory stays opaque relative to the layers below. Neither input is changed.
func stackStates(lower, upper map[string]*Entry) map[string]*Entry {
	out := make(map[string]*Entry, len(lower)+len(upper))
	for p, e := range lower {
		out[p] = e
	}
	paths := make([]string, 0, len(upper))
	for p := range upper {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int {
		if pathLess(a, b) {
			return -1
		}
		if pathLess(b, a) {
			return 1
		}
		return 0
	})
	under := func(p string) {
		for q := range out {
			if strings.HasPrefix(q, p+"/") {
				if _, own := upper[q]; !own {
					delete(out, q)
				}
			}
		}
	}
	for _, p := range paths {
		ue, le := upper[p], lower[p]
		if ue.Kind != KindDir || ue.Opaque {
			if le != nil && le.Kind == KindDir {
				under(p)
			}
			out[p] = ue
			continue
		}
		if le != nil && (le.Kind != KindDir || le.Opaque) {
			c := *ue
			c.Opaque = true
			out[p] = &c
			continue
		}
		out[p] = ue
	}
	return out
}

// exportLowers returns the lower layers of a checkpoint without the folded one: the image.
func (s *Store) exportLowers(lowers []string) []string {
	if s.opts.fold == "" {
		return lowers
	}
	return slices.DeleteFunc(slices.Clone(lowers), func(l string) bool { return l == s.opts.fold })
}

// openFolded opens a folded entry's content in the layer.
func (s *Store) openFolded(e *Entry) (source, error) {
	if s.fold == nil || e.lower != s.opts.fold {
		return source{}, fmt.Errorf("lower layer of %q: %w", e.Path, errdefs.ErrNotFound)
	}
	fd, err := openBeneath(s.fold.fd, e.Path, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return source{}, fmt.Errorf("open folded %q: %w", e.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != e.Size {
		unix.Close(fd)
		if err == nil {
			err = errors.New("changed since it was read")
		}
		return source{}, fmt.Errorf("folded %q: %v: %w", e.Path, err, errdefs.ErrDataLoss)
	}
	return source{fd: fd, owned: true}, nil
}
