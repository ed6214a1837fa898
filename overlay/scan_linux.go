//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// index is the change detector's picture of the upper dir: a key per path and, per
// directory, its name list together with the directory's key when it was read.
//
// What the scan may skip, and why:
//   - Re-reading a directory (getdents) whose own key (inode, ctime, mtime) is unchanged: every
//     create, unlink, rename, link and mknod in a directory moves its mtime and ctime, and an
//     xattr change (the opaque flag) moves its ctime, so an unchanged key means an unchanged
//     name list. The cached names are reused.
//   - Nothing else. A file's content, mode, owner, xattrs and link count change its own
//     ctime but not its directory's, so every entry is still stat'ed (fstatat relative to an
//     open directory fd, spread over a few goroutines). Skipping whole subtrees by a
//     directory's key would miss in-place writes and is NOT valid.
//
// The scan runs while the sandbox is frozen, so the tree does not move under it.
type index struct {
	keys map[string]*idxEntry
	dirs map[string]*dirList
	gen  uint64
}

type idxEntry struct {
	key Key
	gen uint64
}

type dirList struct {
	key   Key
	names []string
}

// newIndex builds an index from persisted keys (directory listings start empty).
func newIndex(keys map[string]*Key) *index {
	ix := &index{keys: make(map[string]*idxEntry, len(keys)), dirs: map[string]*dirList{}}
	for p, k := range keys {
		if k != nil {
			ix.keys[p] = &idxEntry{key: *k}
		}
	}
	return ix
}

// scanned is one upper-dir path the scan found new or changed.
type scanned struct {
	rel   string
	entry *Entry // nil when unchanged
	st    unix.Stat_t
}

// scanResult is what a scan found relative to the index.
type scanResult struct {
	changed []*scanned // sorted parents first
	gone    []string   // indexed paths no longer in the upper dir
	dirs    map[string]*dirList
	gen     uint64
}

// scanUpper walks the upper dir open as rootfd and reports every path that is new or whose
// key differs from the index (every path when all is set), and indexed paths that are gone.
// The index is only read (and its generation marks set); apply commits the result.
func scanUpper(ctx context.Context, rootfd int, ix *index, all bool, workers int) (*scanResult, error) {
	var root unix.Stat_t
	if err := unix.Fstat(rootfd, &root); err != nil {
		return nil, fmt.Errorf("stat upper root: %w", err)
	}
	ix.gen++ // every scan marks with a fresh generation, committed or not
	w := &walker{ctx: ctx, rootfd: rootfd, ix: ix, all: all, gen: ix.gen,
		sem: make(chan struct{}, max(workers, 1)), dirs: map[string]*dirList{}}
	w.wg.Add(1)
	go w.dir("", root)
	w.wg.Wait()
	if w.err != nil {
		return nil, w.err
	}
	res := &scanResult{changed: w.changed, dirs: w.dirs, gen: w.gen}
	for p, ie := range ix.keys {
		if ie.gen != w.gen {
			res.gone = append(res.gone, p)
		}
	}
	sort.Slice(res.changed, func(i, j int) bool { return pathLess(res.changed[i].entry.Path, res.changed[j].entry.Path) })
	sort.Slice(res.gone, func(i, j int) bool { return pathLess(res.gone[i], res.gone[j]) })
	return res, nil
}

// apply commits a scan to the index.
func (ix *index) apply(res *scanResult) {
	for _, c := range res.changed {
		ix.keys[c.entry.Path] = &idxEntry{key: keyOf(&c.st), gen: res.gen}
	}
	for _, p := range res.gone {
		delete(ix.keys, p)
		delete(ix.dirs, p)
	}
	for p, d := range res.dirs {
		ix.dirs[p] = d
	}
}

// walker is one parallel scan: a goroutine per directory, at most cap(sem) running.
type walker struct {
	ctx     context.Context
	rootfd  int
	ix      *index
	all     bool
	gen     uint64
	sem     chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	changed []*scanned
	dirs    map[string]*dirList
	err     error
}

// dir scans one directory and starts the scans of its subdirectories.
func (w *walker) dir(rel string, st unix.Stat_t) {
	defer w.wg.Done()
	w.sem <- struct{}{}
	subdirs, err := w.scanDir(rel, &st)
	<-w.sem
	if err != nil {
		w.fail(err)
		return
	}
	for _, sd := range subdirs {
		w.wg.Add(1)
		go w.dir(sd.rel, sd.st)
	}
}

func (w *walker) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

// scanDir stats every entry of one directory and returns its subdirectories.
func (w *walker) scanDir(rel string, st *unix.Stat_t) ([]*scanned, error) {
	if err := w.ctx.Err(); err != nil {
		return nil, err
	}
	fd, err := openBeneath(w.rootfd, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, fmt.Errorf("open upper dir %q: %w", rel, err)
	}
	defer unix.Close(fd)
	names, err := w.names(fd, rel, st)
	if err != nil {
		return nil, err
	}
	var changed, subdirs []*scanned
	for _, name := range names {
		c, err := w.statEntry(fd, joinPath(rel, name))
		if err != nil {
			return nil, err
		}
		if c == nil {
			continue
		}
		if c.entry != nil {
			changed = append(changed, c)
		}
		if c.st.Mode&unix.S_IFMT == unix.S_IFDIR {
			subdirs = append(subdirs, c)
		}
	}
	w.mu.Lock()
	w.changed = append(w.changed, changed...)
	w.mu.Unlock()
	return subdirs, nil
}

// names returns the directory's names, from the cache when its key is unchanged.
func (w *walker) names(fd int, rel string, st *unix.Stat_t) ([]string, error) {
	key := keyOf(st)
	if d := w.ix.dirs[rel]; d != nil && d.key == key {
		return d.names, nil
	}
	names, err := readDirNames(fd)
	if err != nil {
		return nil, fmt.Errorf("read upper dir %q: %w", rel, err)
	}
	w.mu.Lock()
	w.dirs[rel] = &dirList{key: key, names: names}
	w.mu.Unlock()
	return names, nil
}

// statEntry stats one path; the result has an entry only if the path is new or changed.
func (w *walker) statEntry(dirfd int, rel string) (*scanned, error) {
	_, name := splitPath(rel)
	c := &scanned{rel: rel}
	if err := unix.Fstatat(dirfd, name, &c.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat upper %q: %w", rel, err)
	}
	ie := w.ix.keys[rel]
	if ie != nil {
		ie.gen = w.gen
		if !w.all && ie.key == keyOf(&c.st) {
			return c, nil
		}
	}
	e, err := describe(dirfd, rel, &c.st)
	if err != nil {
		return nil, err
	}
	if c.st.Nlink > 1 && e.Kind != KindDir {
		e.Link = linkID(dirfd, rel, &c.st)
	}
	c.entry = e
	return c, nil
}

// linkID names the hard-link group of a multiply linked inode: its inode number and birth
// time, which stay the same however its paths are captured (a directory rename makes new
// paths for an unchanged inode) and differ from any later inode that reuses the number.
// Without birth times (statx lacking STATX_BTIME) the inode number alone is used.
func linkID(dirfd int, rel string, st *unix.Stat_t) string {
	_, name := splitPath(rel)
	var stx unix.Statx_t
	id := strconv.FormatUint(st.Ino, 10)
	err := unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &stx)
	if err == nil && stx.Mask&unix.STATX_BTIME != 0 {
		id += "." + strconv.FormatInt(stx.Btime.Sec, 10) + "." + strconv.FormatUint(uint64(stx.Btime.Nsec), 10)
	}
	return id
}

// describe records the full state of an upper-dir entry (contents are copied later).
func describe(dirfd int, rel string, st *unix.Stat_t) (*Entry, error) {
	e := entryFromStat(rel, st)
	_, name := splitPath(rel)
	switch e.Kind {
	case KindWhiteout, KindSocket:
		return e, nil
	case KindSymlink:
		t, err := readLinkAt(dirfd, name)
		if err != nil {
			return nil, fmt.Errorf("readlink upper %q: %w", rel, err)
		}
		e.Target = t
	}
	x, opaque, err := readXattrs(procPath(dirfd, name))
	if err != nil {
		return nil, err
	}
	e.Xattrs, e.Opaque = x, opaque && e.Kind == KindDir
	return e, nil
}
