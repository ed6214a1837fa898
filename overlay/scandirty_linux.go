//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// scan finds what changed in the upper dir since the index: from the change tracker when it
// vouches for the interval (only the dirty paths, the paths of changed inodes and the open
// files are stat'ed), else by walking the whole upper dir (which, once applied, primes the
// tracker). all asks for a walk that reports every path. Mapped files are reported changed
// whatever their stat says.
func (s *Store) scan(ctx context.Context, rootfd int, upper string, all bool, open OpenFiles) (*scanResult, error) {
	res, err := s.scanOpen(ctx, rootfd, upper, all, open)
	if res != nil {
		res.closeDirs()
	}
	return res, err
}

// scanOpen is scan leaving the upper directories a tracked scan opened to the caller
// (res.upperDirs, closed by closeDirs): a rollback resolves the same ones again.
func (s *Store) scanOpen(ctx context.Context, rootfd int, upper string, all bool, open OpenFiles) (*scanResult, error) {
	res, err := s.scanChanges(ctx, rootfd, upper, all, open.all())
	if err != nil {
		return nil, err
	}
	if err := s.forceMapped(rootfd, res, open.Mapped); err != nil {
		res.closeDirs()
		return nil, err
	}
	return res, nil
}

// closeDirs closes the upper directories the scan left open.
func (r *scanResult) closeDirs() {
	for _, fd := range r.upperDirs {
		unix.Close(fd)
	}
	r.upperDirs = nil
}

// forceMapped adds to res the mapped regular files it does not list yet.
func (s *Store) forceMapped(rootfd int, res *scanResult, mapped []string) error {
	if len(mapped) == 0 {
		return nil
	}
	listed := map[string]bool{}
	for _, c := range res.changed {
		listed[c.entry.Path] = true
	}
	added := false
	for _, m := range mapped {
		p, err := cleanRel(strings.TrimPrefix(m, "/"))
		if err != nil || listed[p] {
			continue
		}
		pfd, name, err := openParent(rootfd, p)
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open upper dir of %q: %w", p, err)
		}
		var st unix.Stat_t
		err = unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			var c *scanned
			if c, err = describeScanned(pfd, p, &st); err == nil {
				res.changed = append(res.changed, c)
				listed[p], added = true, true
			}
		}
		unix.Close(pfd)
		if err != nil && !isNotExist(err) {
			return fmt.Errorf("stat mapped upper file %q: %w", p, err)
		}
	}
	if added {
		sort.Slice(res.changed, func(i, j int) bool { return pathLess(res.changed[i].entry.Path, res.changed[j].entry.Path) })
	}
	return nil
}

// scanChanges is scan without the mapped files' rule.
func (s *Store) scanChanges(ctx context.Context, rootfd int, upper string, all bool, hints []string) (*scanResult, error) {
	trk := s.trackerFor(upper)
	if trk == nil {
		return scanUpper(ctx, rootfd, s.idx, all, s.opts.workers, nil)
	}
	dirty, inodes, tok, ok := trk.snapshot()
	// A dirty set as large as half the tree costs more to stat path by path than a walk.
	// (Changed inodes cost a map lookup each unless the index knows them, in which case their
	// paths were mostly dirty already.)
	if ok && !all && len(dirty)+len(hints) <= max(len(s.idx.keys)/2, 64) {
		res, err := s.scanTracked(ctx, rootfd, trk, dirty, inodes, hints)
		if err == nil {
			res.trk, res.tok = trk, tok
			scanCounts.tracked.Add(1)
			return res, nil
		}
		if !errors.Is(err, errUnsure) {
			return nil, err
		}
		log.L(ctx).Warn("overlay change tracker cannot vouch for this scan; walking the upper dir",
			"upper", upper, "error", err)
	}
	res, err := scanUpper(ctx, rootfd, s.idx, all, s.opts.workers, trk)
	if err != nil {
		return nil, err
	}
	res.trk, res.tok = trk, tok
	scanCounts.walked.Add(1)
	return res, nil
}

// scanCounts counts the scans of the process by kind (tests read them).
var scanCounts struct{ tracked, walked atomic.Int64 }

// scanTracked is the tracked half of scan.
func (s *Store) scanTracked(ctx context.Context, rootfd int, trk *tracker, dirty []string, inodes []*inodeRec, hints []string) (*scanResult, error) {
	inos, err := trk.resolve(inodes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnsure, err)
	}
	cands := make(map[string]bool, len(dirty)+len(hints))
	for _, p := range dirty {
		cands[p] = true
	}
	for _, h := range hints {
		if c, err := cleanRel(strings.TrimPrefix(h, "/")); err == nil {
			cands[c] = true
		}
	}
	var check *index
	if crossCheckTracking {
		check = s.idx.clone()
	}
	res, err := scanDirty(ctx, rootfd, s.idx, cands, inos, s.opts.workers, trk)
	if err != nil {
		return nil, err
	}
	if check != nil {
		if err := crossCheck(ctx, rootfd, check, res); err != nil {
			return nil, fmt.Errorf("%w (dirty %v, inodes %v)", err, dirty, inos)
		}
	}
	return res, nil
}

// errUnsure means a tracked scan cannot vouch for its result: the caller walks.
var errUnsure = errors.New("change tracker cannot vouch for the scan")

// crossCheckTracking makes every tracked scan also walk the upper dir and fail when the two
// disagree. Tests set it.
var crossCheckTracking bool

// crossCheck compares a tracked scan's result with a walk from the same index.
func crossCheck(ctx context.Context, rootfd int, ix *index, got *scanResult) error {
	n := 0
	for ino, paths := range ix.byIno {
		for _, p := range paths {
			if ie := ix.keys[p]; ie == nil || ie.key.Ino != ino {
				return fmt.Errorf("index by inode lists %s under inode %d", p, ino)
			}
			n++
		}
	}
	if n != len(ix.keys) {
		return fmt.Errorf("index by inode holds %d paths, the index %d", n, len(ix.keys))
	}
	want, err := scanUpper(ctx, rootfd, ix, false, 1, nil)
	if err != nil {
		return err
	}
	summary := func(r *scanResult) map[string]string {
		m := map[string]string{}
		for _, c := range r.changed {
			m[c.entry.Path] = fmt.Sprintf("changed %+v", keyOf(&c.st))
		}
		for _, p := range r.gone {
			m[p] = "gone"
		}
		return m
	}
	g, w := summary(got), summary(want)
	var diffs []string
	for p, v := range w {
		if g[p] != v {
			diffs = append(diffs, fmt.Sprintf("%s: walk says %s, tracker says %q", p, v, g[p]))
		}
	}
	for p, v := range g {
		if _, ok := w[p]; !ok && !strings.HasPrefix(v, "changed") {
			diffs = append(diffs, fmt.Sprintf("%s: tracker says %s, walk finds no change", p, v))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return fmt.Errorf("change tracker missed changes: %s", strings.Join(diffs, "; "))
	}
	return nil
}

// clone copies the index (for crossCheck).
func (ix *index) clone() *index {
	c := &index{keys: make(map[string]*idxEntry, len(ix.keys)), byIno: map[uint64][]string{}, dirs: ix.dirs, gen: ix.gen}
	for p, ie := range ix.keys {
		e := *ie
		c.set(p, &e)
	}
	return c
}

// trackerFor returns the store's change tracker for upper, replacing one that follows
// another dir. nil when change tracking is off or unavailable.
func (s *Store) trackerFor(upper string) *tracker {
	if !s.opts.track {
		return nil
	}
	if s.trk != nil && s.trk.upper != upper {
		s.trk.close()
		s.trk = nil
	}
	if s.trk == nil {
		s.trk = newTracker(upper)
	}
	return s.trk
}

// dirtyScan is one scan of candidate paths.
type dirtyScan struct {
	trk    *tracker
	rootfd int
	ix     *index
	dirfds map[string]int // open directories by path; -1 when not a directory there
	seen   map[string]bool
	inos   map[uint64]uint64 // inode → link count, of the paths probed
	res    *scanResult
	roots  []*scanned // directories to walk: new at their path, or not registered
	vanish []string   // indexed directories gone or replaced: their indexed subtree is checked
}

// scanDirty is scanUpper restricted to candidates: each candidate path is stat'ed and
// compared with the index, and so is every indexed path of a changed inode (unless the
// inode's only link was a candidate already); a directory that is new at its path or not
// registered yet is walked; an indexed directory that vanished takes its indexed subtree
// with it.
func scanDirty(ctx context.Context, rootfd int, ix *index, cands map[string]bool, changed map[uint64]bool, workers int, trk *tracker) (*scanResult, error) {
	w := newWalker(ctx, rootfd, ix, false, workers, trk)
	d := &dirtyScan{trk: trk, rootfd: rootfd, ix: ix, dirfds: map[string]int{}, seen: map[string]bool{},
		inos: map[uint64]uint64{}, res: &scanResult{gen: w.gen, dirs: map[string]*dirList{}}}
	defer d.close()
	paths := make([]string, 0, len(cands))
	for p := range cands {
		paths = append(paths, p)
	}
	sort.Strings(paths) // parents first: their directory fds are reused
	for _, p := range paths {
		if err := d.probe(p, w.gen); err != nil {
			return nil, err
		}
	}
	if err := d.probeInodes(changed, w.gen); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, r := range outermost(d.roots) {
		w.wg.Add(1)
		go w.dir(r.rel, r.st)
	}
	w.wg.Wait()
	if w.err != nil {
		return nil, w.err
	}
	res := d.res
	res.upperDirs = map[string]int{} // handed over: the deferred close leaves them open
	for p, fd := range d.dirfds {
		if fd >= 0 {
			res.upperDirs[p] = fd
		}
	}
	d.dirfds = nil
	res.changed = append(res.changed, w.changed...)
	for p, l := range w.dirs {
		res.dirs[p] = l
	}
	d.vanished(w.gen)
	return d.finish(), nil
}

// outermost returns the directories not inside another of them: a walk of a directory covers
// its subdirectories, and two walks of one directory would race on its index entries.
func outermost(dirs []*scanned) []*scanned {
	set := make(map[string]bool, len(dirs))
	for _, r := range dirs {
		set[r.rel] = true
	}
	var out []*scanned
	for _, r := range dirs {
		inner := false
		for p := parentOf(r.rel); p != "" && !inner; p = parentOf(p) {
			inner = set[p]
		}
		if !inner {
			out = append(out, r) // each path is probed, so listed, once
		}
	}
	return out
}

// probe stats one candidate path and records what changed.
func (d *dirtyScan) probe(p string, gen uint64) error {
	if d.seen[p] {
		return nil
	}
	d.seen[p] = true
	ie := d.ix.keys[p]
	dir, name := splitPath(p)
	pfd, err := d.dirfd(dir)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	exists := pfd >= 0
	if exists {
		if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("stat upper %q: %w", p, err)
			}
			exists = false
		}
	}
	if !exists {
		if ie != nil {
			d.res.gone = append(d.res.gone, p)
			if isDirMode(ie.key.Mode) {
				d.vanish = append(d.vanish, p)
			}
		}
		return nil
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if !isDir {
		d.inos[st.Ino] = uint64(st.Nlink)
	}
	// A directory is walked when it is new at p (another inode, or none, was indexed there)
	// or when this tracker had not registered it at p: no event was attributed to its content.
	walk := isDir && (ie == nil || !isDirMode(ie.key.Mode) || ie.key.Ino != st.Ino)
	if isDir {
		unregistered, err := d.register(p)
		if err != nil {
			return err
		}
		walk = walk || unregistered
	}
	if ie != nil {
		ie.gen = gen
		if isDirMode(ie.key.Mode) && (!isDir || ie.key.Ino != st.Ino) {
			d.vanish = append(d.vanish, p) // replaced: what was indexed under it may be gone
		}
	}
	c := &scanned{rel: p, st: st}
	if ie == nil || ie.key != keyOf(&st) {
		if c, err = describeScanned(pfd, p, &st); err != nil {
			return err
		}
		d.res.changed = append(d.res.changed, c)
	}
	if walk {
		d.roots = append(d.roots, c)
	}
	return nil
}

// probeInodes probes every indexed path of the changed inodes, except inodes whose single
// link was probed already (the usual case: a file written under its own name). A changed
// inode may be known to the index under other names: a hard link's other paths, or the
// name overlayfs reports a hard-linked file's changes under.
func (d *dirtyScan) probeInodes(changed map[uint64]bool, gen uint64) error {
	want := map[uint64]bool{}
	for ino := range changed {
		if n, ok := d.inos[ino]; !ok || n != 1 {
			want[ino] = true
		}
	}
	var todo []string
	for ino := range want {
		for _, p := range d.ix.byIno[ino] {
			if ie := d.ix.keys[p]; ie != nil && !isDirMode(ie.key.Mode) && !d.seen[p] {
				todo = append(todo, p)
			}
		}
	}
	sort.Strings(todo)
	for _, p := range todo {
		if err := d.probe(p, gen); err != nil {
			return err
		}
	}
	return nil
}

// register registers the directory p with the tracker and reports whether it was not
// registered there before.
func (d *dirtyScan) register(p string) (bool, error) {
	fd, err := d.dirfd(p)
	if err != nil || fd < 0 {
		return false, err
	}
	return d.trk.watch(fd, p), nil
}

// vanished adds to gone every indexed path under a vanished or replaced directory that the
// scan did not find again.
func (d *dirtyScan) vanished(gen uint64) {
	if len(d.vanish) == 0 {
		return
	}
	for p, ie := range d.ix.keys {
		if ie.gen == gen {
			continue
		}
		for _, v := range d.vanish {
			if strings.HasPrefix(p, v) && len(p) > len(v) && p[len(v)] == '/' {
				d.res.gone = append(d.res.gone, p)
				break
			}
		}
	}
}

// finish dedupes and sorts the result as scanUpper does.
func (d *dirtyScan) finish() *scanResult {
	res := d.res
	byPath := map[string]*scanned{}
	for _, c := range res.changed {
		byPath[c.entry.Path] = c
	}
	res.changed = res.changed[:0]
	for _, c := range byPath {
		res.changed = append(res.changed, c)
	}
	gone := map[string]bool{}
	for _, p := range res.gone {
		if byPath[p] == nil {
			gone[p] = true
		}
	}
	res.gone = res.gone[:0]
	for p := range gone {
		res.gone = append(res.gone, p)
	}
	sort.Slice(res.changed, func(i, j int) bool { return pathLess(res.changed[i].entry.Path, res.changed[j].entry.Path) })
	sort.Slice(res.gone, func(i, j int) bool { return pathLess(res.gone[i], res.gone[j]) })
	return res
}

// dirfd returns the open upper directory at rel, or -1 when it is not a directory there now
// (missing, or replaced by a file or a symlink, which is never followed).
func (d *dirtyScan) dirfd(rel string) (int, error) {
	if rel == "" {
		return d.rootfd, nil
	}
	if fd, ok := d.dirfds[rel]; ok {
		return fd, nil
	}
	fd, err := openBeneath(d.rootfd, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if isNotExist(err) {
		fd, err = -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("open upper dir %q: %w", rel, err)
	}
	d.dirfds[rel] = fd
	return fd, nil
}

func (d *dirtyScan) close() {
	for _, fd := range d.dirfds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

func isDirMode(mode uint32) bool { return mode&unix.S_IFMT == unix.S_IFDIR }
