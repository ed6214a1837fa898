//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	keys  map[string]*idxEntry
	byIno map[uint64][]string // paths by the inode of their key (the tracker's changed inodes)
	dirs  map[string]*dirList
	gen   uint64
}

type idxEntry struct {
	key Key
	gen uint64
}

type dirList struct {
	key   Key
	names []string
	paths []string // names joined to the directory's path
}

// newIndex builds an index from persisted keys (directory listings start empty).
func newIndex(keys map[string]*Key) *index {
	ix := &index{keys: make(map[string]*idxEntry, len(keys)), byIno: make(map[uint64][]string, len(keys)),
		dirs: map[string]*dirList{}}
	for p, k := range keys {
		if k != nil {
			ix.set(p, &idxEntry{key: *k})
		}
	}
	return ix
}

// set indexes p (every change of keys goes through set and del, which keep byIno).
func (ix *index) set(p string, ie *idxEntry) {
	ix.unlinkIno(p)
	ix.keys[p] = ie
	ix.byIno[ie.key.Ino] = append(ix.byIno[ie.key.Ino], p)
}

// del drops p from the index.
func (ix *index) del(p string) {
	ix.unlinkIno(p)
	delete(ix.keys, p)
}

func (ix *index) unlinkIno(p string) {
	old := ix.keys[p]
	if old == nil {
		return
	}
	paths := ix.byIno[old.key.Ino]
	if i := slices.Index(paths, p); i >= 0 {
		paths = slices.Delete(paths, i, i+1)
	}
	if len(paths) == 0 {
		delete(ix.byIno, old.key.Ino)
	} else {
		ix.byIno[old.key.Ino] = paths
	}
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

	upperDirs map[string]int // upper directories left open by the scan, by path (scanOpen)

	walked bool // the whole upper dir was walked
	trk    *tracker
	tok    scanToken
}

// scanUpper walks the upper dir open as rootfd and reports every path that is new or whose
// key differs from the index (every path when all is set), and indexed paths that are gone.
// The index is only read (and its generation marks set); apply commits the result.
// With a tracker, every directory walked gets a watch.
func scanUpper(ctx context.Context, rootfd int, ix *index, all bool, workers int, trk *tracker) (*scanResult, error) {
	var root unix.Stat_t
	if err := unix.Fstat(rootfd, &root); err != nil {
		return nil, fmt.Errorf("stat upper root: %w", err)
	}
	w := newWalker(ctx, rootfd, ix, all, workers, trk)
	w.wg.Add(1)
	go w.dir("", root)
	w.wg.Wait()
	if w.err != nil {
		return nil, w.err
	}
	res := &scanResult{changed: w.changed, dirs: w.dirs, gen: w.gen, walked: true}
	for p, ie := range ix.keys {
		if ie.gen != w.gen {
			res.gone = append(res.gone, p)
		}
	}
	sort.Slice(res.changed, func(i, j int) bool { return pathLess(res.changed[i].entry.Path, res.changed[j].entry.Path) })
	sort.Slice(res.gone, func(i, j int) bool { return pathLess(res.gone[i], res.gone[j]) })
	return res, nil
}

// newWalker prepares a walk with a fresh generation mark (every scan gets one, committed or
// not).
func newWalker(ctx context.Context, rootfd int, ix *index, all bool, workers int, trk *tracker) *walker {
	ix.gen++
	return &walker{ctx: ctx, rootfd: rootfd, ix: ix, all: all, gen: ix.gen, trk: trk,
		sem: make(chan struct{}, max(workers, 1)), dirs: map[string]*dirList{}}
}

// apply commits a scan to the index (and tells the tracker what it covered).
func (ix *index) apply(res *scanResult) {
	for _, c := range res.changed {
		ix.set(c.entry.Path, &idxEntry{key: keyOf(&c.st), gen: res.gen})
	}
	if res.trk != nil {
		res.trk.commit(res.tok, res.walked)
	}
	for _, p := range res.gone {
		ix.del(p)
		delete(ix.dirs, p)
	}
	for p, d := range res.dirs {
		ix.dirs[p] = d
	}
}

// walker is one parallel scan: a goroutine per directory, and per chunk of scanChunk names
// of a large directory, at most cap(sem) of them statting at a time.
type walker struct {
	ctx     context.Context
	rootfd  int
	ix      *index
	all     bool
	gen     uint64
	trk     *tracker // nil: no watches
	sem     chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	changed []*scanned
	dirs    map[string]*dirList
	err     error
}

// scanChunk is how many names of one directory a single worker stats: a flat directory of
// thousands of files is spread over all workers.
const scanChunk = 256

// dir scans one directory: it lists it, hands all chunks of its names but the first to other
// goroutines, stats the first itself and closes the directory when every chunk is done. It
// gives up its worker slot before waiting, so waiting directories never starve the scan.
func (w *walker) dir(rel string, st unix.Stat_t) {
	defer w.wg.Done()
	w.sem <- struct{}{}
	fd, d, err := w.open(rel, &st)
	if err != nil {
		<-w.sem
		w.fail(err)
		return
	}
	var chunks sync.WaitGroup
	for lo := scanChunk; lo < len(d.names); lo += scanChunk {
		chunks.Add(1)
		go func(lo, hi int) {
			defer chunks.Done()
			w.sem <- struct{}{}
			w.chunk(fd, d, lo, hi)
			<-w.sem
		}(lo, min(lo+scanChunk, len(d.names)))
	}
	w.chunk(fd, d, 0, min(scanChunk, len(d.names)))
	<-w.sem
	chunks.Wait()
	unix.Close(fd)
}

// chunk stats names[lo:hi] of one open directory and starts the scans of subdirectories.
func (w *walker) chunk(fd int, d *dirList, lo, hi int) {
	if err := w.ctx.Err(); err != nil {
		w.fail(err)
		return
	}
	changed, subdirs, err := w.statNames(fd, d, lo, hi)
	if err != nil {
		w.fail(err)
		return
	}
	if len(changed) > 0 {
		w.mu.Lock()
		w.changed = append(w.changed, changed...)
		w.mu.Unlock()
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

// open opens one upper directory and returns it with its name list.
func (w *walker) open(rel string, st *unix.Stat_t) (int, *dirList, error) {
	if err := w.ctx.Err(); err != nil {
		return -1, nil, err
	}
	fd, err := openBeneath(w.rootfd, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return -1, nil, fmt.Errorf("open upper dir %q: %w", rel, err)
	}
	if w.trk != nil {
		_ = w.trk.watch(fd, rel)
	}
	d, err := w.names(fd, rel, st)
	if err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	return fd, d, nil
}

// names returns the directory's list, from the cache when its key is unchanged.
func (w *walker) names(fd int, rel string, st *unix.Stat_t) (*dirList, error) {
	key := keyOf(st)
	if d := w.ix.dirs[rel]; d != nil && d.key == key {
		return d, nil
	}
	names, err := readDirNames(fd)
	if err != nil {
		return nil, fmt.Errorf("read upper dir %q: %w", rel, err)
	}
	d := &dirList{key: key, names: names, paths: make([]string, len(names))}
	for i, n := range names {
		d.paths[i] = joinPath(rel, n)
	}
	w.mu.Lock()
	w.dirs[rel] = d
	w.mu.Unlock()
	return d, nil
}

// statNames stats names[lo:hi] of directory fd. It returns the new or changed paths (with
// entries) and the subdirectories; an unchanged non-directory costs one fstatat and one map
// lookup, nothing else.
func (w *walker) statNames(fd int, d *dirList, lo, hi int) (changed, subdirs []*scanned, err error) {
	var st unix.Stat_t
	for i := lo; i < hi; i++ {
		if err := unix.Fstatat(fd, d.names[i], &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, nil, fmt.Errorf("stat upper %q: %w", d.paths[i], err)
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		ie := w.ix.keys[d.paths[i]]
		if ie != nil {
			ie.gen = w.gen
			if !w.all && ie.key == keyOf(&st) {
				if isDir {
					subdirs = append(subdirs, &scanned{rel: d.paths[i], st: st})
				}
				continue
			}
		}
		c, err := describeScanned(fd, d.paths[i], &st)
		if err != nil {
			return nil, nil, err
		}
		changed = append(changed, c)
		if isDir {
			subdirs = append(subdirs, c)
		}
	}
	return changed, subdirs, nil
}

// describeScanned records a new or changed upper path.
func describeScanned(dirfd int, rel string, st *unix.Stat_t) (*scanned, error) {
	e, err := describe(dirfd, rel, st)
	if err != nil {
		return nil, err
	}
	if st.Nlink > 1 && e.Kind != KindDir {
		e.Link = linkID(dirfd, rel, st)
	}
	return &scanned{rel: rel, entry: e, st: *st}, nil
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
	x, opaque, err := readXattrsAt(dirfd, name)
	if err != nil {
		return nil, err
	}
	e.Xattrs, e.Opaque = x, opaque && e.Kind == KindDir
	return e, nil
}
