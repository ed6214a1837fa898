//go:build linux

package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/containerd/errdefs"
	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// plan is a rollback worked out completely (and its content sources opened) before the first
// write: what to remove (children before parents), what to create or re-attribute (parents
// before children; existing directories only when their mode, owner or xattrs differ) and
// which directories get their mtime back at the end.
type plan struct {
	remove      []string
	removedDirs []string
	items       []*planned // creates and fixes, parents first
	dirTimes    []*Entry   // deepest first
	touched     map[string]bool
	done        []string
	srcs        map[string]source
	forced      map[string]bool // directories whose children must all be visited
	rawUpper    bool            // writing an upper dir directly (export): whiteouts and opaque flags are literal
	// mdirs and udirs are the merged and upper directories resolved while planning (nil
	// when the plan was not worked out against a tree), kept for the writes and the
	// reindex: each directory is resolved once per rollback, not once per entry and check.
	mdirs, udirs *dirCache
	packSizes    map[*os.File]int64 // sizes of the packs read from, taken once (readPacked)
	mtimeOK      map[string]bool    // existing directories whose mtime is the target's already
	inlined      int64              // bytes of content held in sources' data
}

// planned is one entry to create (or, with fix, an existing directory to re-attribute; with
// rewrite, an existing single-link regular file to restore in place).
type planned struct {
	e       *Entry
	fix     bool
	rewrite bool
}

// source is where a restored file's content comes from.
type source struct {
	fd    int
	off   int64
	owned bool   // fd belongs to the plan (a lower file)
	data  []byte // the content itself, read (and its digest checked) while planning
}

func (pl *plan) close() {
	for _, s := range pl.srcs {
		if s.owned {
			unix.Close(s.fd)
		}
	}
	pl.mdirs.close()
	pl.udirs.close()
}

// plan decides, for every changed path and everything it drags in (ancestors, hard-link
// peers, children of directories whose merged content must be rebuilt), how to get from the
// merged tree as it is to the merged tree at the target.
// upperDirs are upper directories open already (by path, as a scan resolved them), which the
// plan takes over (and closes).
func (s *Store) plan(v *view, fds rollbackRoots, changed map[string]bool, upperDirs map[string]int) (*plan, error) {
	pl := &plan{touched: map[string]bool{}, srcs: map[string]source{}, forced: map[string]bool{},
		mdirs: newDirCache(fds.merged), udirs: newDirCache(fds.upper), mtimeOK: map[string]bool{}}
	pl.udirs.adopt(upperDirs)
	queue := withAncestors(changed)
	seen := map[string]bool{}
	for _, p := range queue {
		seen[p] = true
	}
	var groups map[string][]string
	kept := map[string]bool{"": true}
	for i := 0; i < len(queue); i++ {
		p := queue[i]
		if !changed[p] && !pl.forced[p] && kept[parentOf(p)] {
			ok, err := pl.keepAncestor(v, p)
			if err != nil {
				pl.close()
				return nil, err
			}
			if ok {
				kept[p] = true
				continue
			}
		}
		more, want, err := pl.decide(v, fds, p)
		if err != nil {
			pl.close()
			return nil, err
		}
		if want != nil && want.Link != "" {
			if groups == nil {
				groups = v.linkGroups()
			}
			more = append(more, groups[want.Link]...)
		}
		for _, p := range more {
			// Ancestors too: writing p moves its parent's mtime, which must be restored.
			for q := p; q != "" && !seen[q]; q = parentOf(q) {
				seen[q] = true
				queue = append(queue, q)
			}
		}
	}
	if err := pl.prepare(s, v); err != nil {
		pl.close()
		return nil, err
	}
	return pl, nil
}

// keepAncestor plans a directory that is only the ancestor of changed paths, not forced, and
// whose own ancestors were all kept so: nothing recorded or scanned since the target changed
// it or the directories above it (a change above could hide or replace it without naming it:
// a lower-only directory is in no index), so its merged entry is the target's already (the
// same upper directory over the same lower layers). Its mtime is set back only if the writes
// under it move it (apply). It reports false, and the directory is decided as a changed
// path, when the target has no directory there.
func (pl *plan) keepAncestor(v *view, p string) (bool, error) {
	want, err := v.lookup(p)
	if err != nil || want == nil || want.Kind != KindDir {
		return false, err
	}
	pl.dirTimes = append(pl.dirTimes, want)
	pl.mtimeOK[p] = true
	return true, nil
}

// withAncestors returns the paths and all their ancestors, sorted parents first.
func withAncestors(set map[string]bool) []string {
	all := map[string]bool{}
	for p := range set {
		for q := p; q != "" && !all[q]; q = parentOf(q) {
			all[q] = true
		}
	}
	out := make([]string, 0, len(all))
	for p := range all {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return pathLess(out[i], out[j]) })
	return out
}

// decide plans one path and returns further paths that must be visited.
func (pl *plan) decide(v *view, fds rollbackRoots, p string) ([]string, *Entry, error) {
	want, err := v.lookup(p)
	if err != nil {
		return nil, nil, err
	}
	have, err := pl.mdirs.lstat(p)
	if err != nil {
		return nil, nil, err
	}
	pl.touched[p] = true
	haveDir := have != nil && have.Mode&unix.S_IFMT == unix.S_IFDIR
	if want != nil && want.Kind == KindDir && haveDir {
		return pl.decideDir(v, fds, p, want, have)
	}
	if want != nil && rewritable(want, have) {
		pl.items = append(pl.items, &planned{e: want, rewrite: true})
		pl.done = append(pl.done, p)
		return nil, want, nil
	}
	if have != nil {
		pl.remove = append(pl.remove, p)
		if haveDir {
			pl.removedDirs = append(pl.removedDirs, p)
		}
	}
	if want == nil {
		if have != nil {
			pl.done = append(pl.done, p)
		}
		return nil, nil, nil
	}
	pl.items = append(pl.items, &planned{e: want})
	pl.done = append(pl.done, p)
	if want.Kind != KindDir {
		return nil, want, nil
	}
	pl.dirTimes = append(pl.dirTimes, want)
	names, err := v.childNames(p)
	return prefixAll(p, names), want, err
}

// rewritable says whether the file want can be restored by rewriting what is there in place:
// a regular file with no other link, and no hard-link group to rebuild.
func rewritable(want *Entry, have *unix.Stat_t) bool {
	return want.Kind == KindFile && want.Link == "" && have != nil &&
		have.Mode&unix.S_IFMT == unix.S_IFREG && have.Nlink == 1
}

// decideDir plans a directory that exists in both trees: its attributes are restored, and if
// its opaque flag in the upper dir differs from the target's, the lower entries it shows or
// hides differ too, so every child on either side is visited. The same then holds for its
// subdirectories (an opaque parent hides their lower copies as well), so they are forced.
func (pl *plan) decideDir(v *view, fds rollbackRoots, p string, want *Entry, have *unix.Stat_t) ([]string, *Entry, error) {
	pl.dirTimes = append(pl.dirTimes, want)
	if have.Mtim.Nano() == want.Mtime {
		pl.mtimeOK[p] = true
	}
	meta, err := metaDiffers(pl.mdirs, p, want, have)
	if err != nil {
		return nil, nil, err
	}
	if meta {
		pl.items = append(pl.items, &planned{e: want, fix: true})
	}
	if meta || have.Mtim.Nano() != want.Mtime {
		pl.done = append(pl.done, p)
	}
	if !pl.forced[p] && pl.udirs.opaque(p) == want.Opaque {
		return nil, want, nil
	}
	names, err := v.childNames(p)
	if err != nil {
		return nil, nil, err
	}
	cur, err := mergedChildren(fds.merged, p)
	if err != nil {
		return nil, nil, err
	}
	children := prefixAll(p, append(names, cur...))
	for _, c := range children {
		pl.forced[c] = true
	}
	return children, want, nil
}

func prefixAll(dir string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = joinPath(dir, n)
	}
	return out
}

// prepare orders the plan and opens every content source, so that a missing checkpoint file
// or lower file fails the rollback before anything was written.
func (pl *plan) prepare(s *Store, v *view) error {
	sortDeepestFirst(pl.remove)
	sort.Slice(pl.items, func(i, j int) bool { return pathLess(pl.items[i].e.Path, pl.items[j].e.Path) })
	paths := make([]string, 0, len(pl.dirTimes))
	byPath := map[string]*Entry{}
	for _, e := range pl.dirTimes {
		paths = append(paths, e.Path)
		byPath[e.Path] = e
	}
	sortDeepestFirst(paths)
	pl.dirTimes = pl.dirTimes[:0]
	for _, p := range paths {
		pl.dirTimes = append(pl.dirTimes, byPath[p])
	}
	sort.Strings(pl.done)
	for _, it := range pl.items {
		if it.fix || it.e.Kind != KindFile || it.e.Size == 0 {
			continue
		}
		var src source
		var err error
		if it.e.lower == "" && it.e.Size <= maxInlineFile && pl.inlined+it.e.Size <= maxInlineTotal {
			src, err = pl.readPacked(s, it.e)
		} else {
			src, err = openSource(s, v, it.e)
		}
		if err != nil {
			return err
		}
		pl.srcs[it.e.Path] = src
	}
	return nil
}

// Small contents are read while planning (maxInlineFile each, maxInlineTotal per plan): the
// digest check reads them anyway, and the write then needs no second read.
const (
	maxInlineFile  = 1 << 20
	maxInlineTotal = 16 << 20
)

// readPacked is openSource for a file whose content is in a pack, read into the source: the
// extent is checked against the pack's size (taken once per pack and plan) and the content
// against its digest, as checkContent does, from the one read.
func (pl *plan) readPacked(s *Store, e *Entry) (source, error) {
	f := s.packs[e.ckpt]
	if f == nil {
		return source{}, fmt.Errorf("content of %q in checkpoint %s: %w", e.Path, e.ckpt, errdefs.ErrNotFound)
	}
	size, ok := pl.packSizes[f]
	if !ok {
		st, err := f.Stat()
		if err != nil {
			return source{}, err
		}
		size = st.Size()
		if pl.packSizes == nil {
			pl.packSizes = map[*os.File]int64{}
		}
		pl.packSizes[f] = size
	}
	if err := extentInside(e, size); err != nil {
		return source{}, err
	}
	data := make([]byte, e.Size)
	if err := preadFull(int(f.Fd()), data, e.Off); err != nil {
		return source{}, fmt.Errorf("read content of %q in checkpoint %s: %w", e.Path, e.ckpt, err)
	}
	if err := checkSum(e, xxh3.Hash(data)); err != nil {
		return source{}, err
	}
	pl.inlined += e.Size
	return source{fd: int(f.Fd()), off: e.Off, data: data}, nil
}

// openSource opens where a file's content at the target lives.
func openSource(s *Store, v *view, e *Entry) (source, error) {
	if e.lower != "" {
		for i, l := range viewLayers(v) {
			if l == e.lower {
				fd, err := openBeneath(v.fds[i], e.Path, unix.O_RDONLY|unix.O_NOFOLLOW)
				if err != nil {
					return source{}, fmt.Errorf("open lower %q: %w", e.Path, err)
				}
				return source{fd: fd, owned: true}, nil
			}
		}
		return s.openFolded(e) // the folded layer (WithFoldedLower), not one of v's
	}
	f := s.packs[e.ckpt]
	if f == nil {
		return source{}, fmt.Errorf("content of %q in checkpoint %s: %w", e.Path, e.ckpt, errdefs.ErrNotFound)
	}
	if err := checkContent(f, e); err != nil {
		return source{}, err
	}
	return source{fd: int(f.Fd()), off: e.Off}, nil
}

// viewLayers returns v's lower layers (none for a nil view).
func viewLayers(v *view) []string {
	if v == nil {
		return nil
	}
	return v.layers
}

// checkExtent verifies that a content extent lies inside its pack.
func checkExtent(f *os.File, e *Entry) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	return extentInside(e, st.Size())
}

// extentInside verifies that a content extent lies inside a pack of size bytes.
func extentInside(e *Entry, size int64) error {
	if e.Off < 0 || e.Off+e.Size > size-footerSize {
		return fmt.Errorf("content of %q outside checkpoint %s: %w", e.Path, e.ckpt, errdefs.ErrDataLoss)
	}
	return nil
}

// metaDiffers reports whether an existing directory's mode, owner or xattrs differ from want
// (its mtime is restored anyway, after its children).
func metaDiffers(dirs *dirCache, rel string, want *Entry, have *unix.Stat_t) (bool, error) {
	if have.Mode&0o7777 != want.Mode || have.Uid != want.UID || have.Gid != want.GID {
		return true, nil
	}
	dir, name := splitPath(rel)
	pfd, err := dirs.get(dir)
	if err != nil {
		return false, err
	}
	x, _, err := readXattrsAt(pfd, name)
	if err != nil {
		return false, err
	}
	return !sameXattrs(x, want.Xattrs), nil
}

func sameXattrs(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// opaque reports whether rel is an opaque directory, in a cache of an upper dir. The answer
// is kept until forget drops it: only a directory made anew at rel (removed and created
// again, or created where there was none) can change it, as overlayfs keeps the flag of a
// directory through the merged mount.
func (c *dirCache) opaque(rel string) bool {
	if o, ok := c.opq[rel]; ok {
		return o
	}
	dir, name := splitPath(rel)
	pfd, err := c.get(dir)
	if err != nil {
		return false
	}
	v, err := getXattrAt(pfd, name, "trusted.overlay.opaque")
	o := err == nil && string(v) == "y"
	if err == nil || errors.Is(err, unix.ENODATA) {
		c.opq[rel] = o // a failure to read is not an answer
	}
	return o
}

// mergedChildren lists directory rel of the merged tree.
func mergedChildren(rootfd int, rel string) ([]string, error) {
	fd, err := openBeneath(rootfd, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, fmt.Errorf("open merged %q: %w", rel, err)
	}
	defer unix.Close(fd)
	return readDirNames(fd)
}
