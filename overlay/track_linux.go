//go:build linux

package overlay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Change tracking: which upper-dir paths and inodes may have changed since the last applied
// scan.
//
// A walk of the upper dir costs one fstatat per entry (~5 ms for 5,000 files here), which is
// most of an L1 checkpoint. The tracker lets a capture stat only what may have changed. It is
// written by hand on fanotify because no library fits: fsnotify/fsnotify is inotify, whose
// events name a path only, and a capture must drain the queue synchronously, while the
// sandbox is frozen, to know it has every event of every completed write.
//
// One fanotify group with a filesystem mark on the upper dirs' filesystem sees every change
// made there, whichever directory it happens in, each event naming the parent directory (by
// file handle) and entry name and the changed inode (by file handle). Writes through the
// overlay mount reach the upper filesystem through the VFS, so they are all seen: content
// writes (write, truncate, fallocate, copy_file_range), metadata (chmod, chown, utimes,
// xattrs, link counts), creates, deletes, renames, copy-ups and whiteouts.
//
// Directories of an upper dir are known by file handle (registered by the walks and the
// scans that look at them). An event in a known directory makes its path "dirty", and the
// directory's own path when a name in it was created, deleted or moved (its mtime moved).
// Every event's inode, wherever it happened, is remembered by handle: a scan resolves the
// handles to inode numbers and stats every indexed path of those inodes. That covers what
// paths cannot: overlayfs reports changes to a hard-linked file under whichever name it first
// looked the inode up by (possibly deleted since, possibly in a deleted directory), and a link
// count change has no name at all. A scan stats the dirty paths and the paths of the changed
// inodes, and walks directories that are new at their path or not registered yet.
//
// What is not reported, and how it is covered:
//   - Writes through a shared writable mmap are reported only when the file's last reference
//     goes (close-write). The caller passes the files its sandbox's processes hold open for
//     writing or have mapped shared and writable (see WritableFiles): the former are stat'ed
//     like dirty paths, the latter recorded whatever their stat says (a second write to a
//     page still dirty does not even move the mtime).
//   - A full event queue, a handle that cannot be resolved, too many dirty entries, or a
//     directory another tracker registered: the tracker stops vouching, and the next scan
//     walks the whole upper dir again (which re-primes it).
//
// The mark sees the whole filesystem (the host's writes to it too) while some tracker is
// open; a goroutine drains it in 10 ms batches, keeping only handles and names, so the
// kernel queue does not overflow between checkpoints.

// fanMask is what the filesystem mark reports.
const fanMask = unix.FAN_MODIFY | unix.FAN_ATTRIB | unix.FAN_CLOSE_WRITE | unix.FAN_CREATE |
	unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO | unix.FAN_DELETE_SELF |
	unix.FAN_MOVE_SELF | unix.FAN_ONDIR

// fanNamespace are the events that change a directory's entries.
const fanNamespace = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO

// maxDirty bounds what a tracker (and the watcher, in changed inodes) keeps between scans:
// past it the tracker gives up until the next walk, which is then the cheaper scan anyway.
// A variable for the tests.
var maxDirty atomic.Int64

func init() { maxDirty.Store(1 << 16) }

// dirtyBound is maxDirty's current value (tests lower it while watchers run).
func dirtyBound() int { return int(maxDirty.Load()) }

// watcher is the process's fanotify group.
type watcher struct {
	mu     sync.Mutex
	fd     int
	seq    uint64               // drain generation: what one drain reads is marked with it
	marked map[string]int       // filesystems with a mark (by fsid) → trackers on them
	dirs   map[string]*watchDir // directory handle key → directory
	inodes map[string]*inodeRec // changed inodes by handle key
	// inodesPeak is the most inodes held since the map was last made (shrink).
	inodesPeak int
	quieted    map[string]*inodeRec // inodes with an ignore mark for writes (see quiet)
	trackers   map[*tracker]bool
	buf        []byte
}

// watchDir is one registered upper directory.
type watchDir struct {
	t   *tracker
	rel string // its path in the upper dir when last registered
}

// inodeRec is a changed inode seen by handle.
type inodeRec struct {
	fsid   string
	handle unix.FileHandle
	seq    uint64
	ino    uint64 // resolved inode number; 0 until resolved
	gone   bool   // resolved as deleted (no link left)
	writes int    // write events since the last snapshot (see quiet)
}

var (
	theWatcher     *watcher
	theWatcherErr  error
	theWatcherOnce sync.Once
)

// TrackingAvailable reports why change tracking cannot work here (nil: it can): fanotify
// with file handles, which needs CAP_SYS_ADMIN and Linux 5.9.
func TrackingAvailable() error {
	_, err := sharedWatcher()
	return err
}

// sharedWatcher returns the process's watcher, starting it on first use.
func sharedWatcher() (*watcher, error) {
	theWatcherOnce.Do(func() {
		fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|
			unix.FAN_REPORT_DFID_NAME|unix.FAN_REPORT_FID, unix.O_RDONLY|unix.O_CLOEXEC)
		if err != nil {
			theWatcherErr = fmt.Errorf("fanotify_init: %w", err)
			return
		}
		theWatcher = &watcher{fd: fd, marked: map[string]int{}, dirs: map[string]*watchDir{},
			inodes: map[string]*inodeRec{}, quieted: map[string]*inodeRec{}, trackers: map[*tracker]bool{},
			buf: make([]byte, 256<<10)}
		go theWatcher.loop()
	})
	return theWatcher, theWatcherErr
}

// drainDelay is how long the background drain lets events gather after the first one: the
// kernel merges a queued event with a new one for the same inode, so a file written in a
// tight loop costs one event per delay instead of one per write (measured here: a 64-byte
// write() costs ~1.1 µs more under an eagerly drained mark, ~0.5 µs with 10 ms batches).
// Scans drain synchronously, so the delay never delays a checkpoint.
const drainDelay = 10 * time.Millisecond

// loop drains events as they come, in batches.
func (w *watcher) loop() {
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			slog.Error("overlay change tracker: poll fanotify", "error", err)
			return
		}
		time.Sleep(drainDelay)
		w.mu.Lock()
		w.drain()
		w.mu.Unlock()
	}
}

// drain reads every queued event. Callers hold w.mu.
func (w *watcher) drain() {
	w.seq++
	for {
		n, err := unix.Read(w.fd, w.buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 {
			if err != nil && !errors.Is(err, unix.EAGAIN) {
				w.overflow("reading fanotify: " + err.Error())
			}
			return
		}
		for off := 0; off+int(unsafe.Sizeof(unix.FanotifyEventMetadata{})) <= n; {
			md := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&w.buf[off]))
			if md.Event_len == 0 || off+int(md.Event_len) > n {
				break
			}
			if md.Fd >= 0 {
				unix.Close(int(md.Fd))
			}
			w.event(md.Mask, w.buf[off+int(md.Metadata_len):off+int(md.Event_len)])
			off += int(md.Event_len)
		}
	}
}

// fidRecord is one parsed fanotify info record carrying a file handle.
type fidRecord struct {
	kind   uint8
	fsid   string
	handle unix.FileHandle
	key    string
	name   string
}

// parseRecords reads the info records of one event.
func parseRecords(b []byte) []fidRecord {
	var out []fidRecord
	for len(b) >= 4 {
		kind, size := b[0], int(binary.LittleEndian.Uint16(b[2:]))
		if size < 4 || size > len(b) {
			break
		}
		rec := b[:size]
		b = b[size:]
		// struct fanotify_event_info_fid: header, fsid (8), struct file_handle, [name].
		if size < 4+8+8 {
			continue
		}
		hlen := int(binary.LittleEndian.Uint32(rec[12:]))
		htype := int32(binary.LittleEndian.Uint32(rec[16:]))
		if 20+hlen > size {
			continue
		}
		r := fidRecord{kind: kind, fsid: string(rec[4:12])}
		r.handle = unix.NewFileHandle(htype, append([]byte(nil), rec[20:20+hlen]...))
		r.key = handleKey(r.fsid, r.handle)
		if kind == unix.FAN_EVENT_INFO_TYPE_DFID_NAME {
			name := rec[20+hlen:]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			r.name = string(name)
		}
		out = append(out, r)
	}
	return out
}

func handleKey(fsid string, h unix.FileHandle) string {
	return fsid + strconv.Itoa(int(h.Type())) + ":" + string(h.Bytes())
}

// event records one fanotify event. Callers hold w.mu.
func (w *watcher) event(mask uint64, info []byte) {
	if mask&unix.FAN_Q_OVERFLOW != 0 {
		w.overflow("fanotify queue overflowed")
		return
	}
	if len(w.trackers) == 0 {
		return
	}
	var dir *watchDir
	name := ""
	for _, r := range parseRecords(info) {
		switch r.kind {
		case unix.FAN_EVENT_INFO_TYPE_DFID_NAME, unix.FAN_EVENT_INFO_TYPE_DFID:
			dir, name = w.dirs[r.key], r.name
			if mask&unix.FAN_DELETE_SELF != 0 && name == "." && dir != nil {
				delete(w.dirs, r.key) // a removed directory of a sandbox
				delete(dir.t.dirKeys, r.key)
			}
		case unix.FAN_EVENT_INFO_TYPE_FID:
			w.inode(r, mask)
		}
	}
	if dir == nil {
		return
	}
	switch t := dir.t; {
	case name == "" || name == ".": // the directory itself
		if dir.rel != "" {
			t.mark(dir.rel, w.seq)
		}
	default:
		t.mark(joinPath(dir.rel, name), w.seq)
		if mask&fanNamespace != 0 && dir.rel != "" {
			t.mark(dir.rel, w.seq) // the directory's own mtime moved
		}
	}
}

// inode remembers a changed inode. Callers hold w.mu.
func (w *watcher) inode(r fidRecord, mask uint64) {
	rec := w.inodes[r.key]
	if rec == nil {
		rec = &inodeRec{fsid: r.fsid, handle: r.handle}
		w.inodes[r.key] = rec
	}
	rec.seq = w.seq
	if mask&unix.FAN_MODIFY != 0 {
		if rec.writes++; rec.writes == hotWrites {
			w.quiet(r.key, rec)
		}
	}
	if len(w.inodes) > dirtyBound() {
		w.shed()
	}
}

// hotWrites is how many write events of one inode (since the last scan) make it "hot": its
// further write events are ignored until the next scan, which stats it anyway. A file
// written in a loop then costs the kernel a mark lookup per write instead of an event (here
// ~150 ns more per 64-byte write instead of ~480, BenchmarkWriteTax). Queued events of one
// file merge, so "hot" means written across hotWrites drain batches.
const hotWrites = 8

// quiet adds an ignore mark for write events to a hot inode. Callers hold w.mu. Dropping
// those events loses nothing: the inode is already in the changed set, and every scan's
// snapshot removes all ignore marks (while its sandbox is frozen) before it reads the set,
// so writes after that raise events again. Failure just leaves the inode noisy.
func (w *watcher) quiet(key string, rec *inodeRec) {
	fd := w.openHandle(rec)
	if fd < 0 {
		return
	}
	defer unix.Close(fd)
	err := unix.FanotifyMark(w.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_IGNORED_MASK|unix.FAN_MARK_IGNORED_SURV_MODIFY,
		unix.FAN_MODIFY, unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd))
	if err == nil {
		w.quieted[key] = rec
	}
}

// unquiet removes every ignore mark quiet added. Callers hold w.mu.
func (w *watcher) unquiet() {
	for key, rec := range w.quieted {
		if fd := w.openHandle(rec); fd >= 0 {
			_ = unix.FanotifyMark(w.fd, unix.FAN_MARK_REMOVE|unix.FAN_MARK_IGNORED_MASK,
				unix.FAN_MODIFY, unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd))
			unix.Close(fd)
		}
		rec.writes = 0
		delete(w.quieted, key)
	}
	for _, rec := range w.inodes {
		rec.writes = 0
	}
}

// openHandle opens an inode by handle (O_PATH) through a tracker on its filesystem; -1 when
// it is gone or no tracker is there. Callers hold w.mu.
func (w *watcher) openHandle(rec *inodeRec) int {
	for t := range w.trackers {
		if t.fsid == rec.fsid {
			fd, err := unix.OpenByHandleAt(t.mountfd, rec.handle, unix.O_PATH|unix.O_CLOEXEC)
			if err != nil {
				return -1
			}
			return fd
		}
	}
	return -1
}

// shed makes room in the changed-inode set, which keeps what the least recently scanned
// tracker has not seen yet: that tracker (a sandbox idle while others and the host write)
// stops vouching, so its next capture walks and it needs none of the set, which is pruned.
// Busy trackers keep vouching. Callers hold w.mu.
func (w *watcher) shed() {
	for len(w.inodes) > dirtyBound()/2 && len(w.trackers) > 0 {
		var oldest *tracker
		for t := range w.trackers {
			if oldest == nil || t.applied < oldest.applied {
				oldest = t
			}
		}
		if oldest.applied >= w.seq {
			break // every tracker is up to date: the set is this interval's
		}
		oldest.distrust("too many changed inodes since its last checkpoint")
		oldest.applied = w.seq
		w.prune()
	}
	if len(w.inodes) > dirtyBound() {
		w.overflow("too many changed inodes between checkpoints")
	}
}

// overflow makes every tracker walk again: events were lost. Callers hold w.mu.
func (w *watcher) overflow(why string) {
	for t := range w.trackers {
		t.distrust(why)
	}
	w.inodes, w.inodesPeak = map[string]*inodeRec{}, 0
}

// prune forgets changed inodes every tracker has scanned past. Callers hold w.mu.
func (w *watcher) prune() {
	low := w.seq
	for t := range w.trackers {
		low = min(low, t.applied)
	}
	before := len(w.inodes)
	for k, rec := range w.inodes {
		if rec.seq <= low {
			delete(w.inodes, k)
		}
	}
	w.inodes = shrink(w.inodes, before, &w.inodesPeak)
}

// shrink returns m, or a copy of it sized to what it holds once it holds an eighth or less
// of the most it held (*peak; before is its size before the caller's deletions). A Go map
// keeps its buckets after deletes, and a range over it visits them all: the dirty paths
// and changed inodes, ranged over by every scan, would otherwise cost a sandbox that once
// wrote 5,000 files (its setup) ~50 us per rollback ever after.
func shrink[K comparable, V any](m map[K]V, before int, peak *int) map[K]V {
	*peak = max(*peak, before)
	if n := len(m); *peak >= 256 && n <= *peak/8 {
		c := make(map[K]V, n)
		maps.Copy(c, m)
		*peak = n
		return c
	}
	return m
}

// mark makes sure the filesystem holding the open directory fd is marked, and counts one
// more tracker on it. Callers hold w.mu.
func (w *watcher) mark(fd int, fsid string) error {
	if w.marked[fsid] == 0 {
		err := unix.FanotifyMark(w.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, fanMask, fd, "")
		if err != nil {
			return fmt.Errorf("fanotify_mark: %w", err)
		}
	}
	w.marked[fsid]++
	return nil
}

// unmark counts one tracker less on the filesystem of fd and removes the mark with the last
// one: with no sandbox to track, the filesystem's writes cost nothing. Callers hold w.mu.
func (w *watcher) unmark(fd int, fsid string) {
	if w.marked[fsid]--; w.marked[fsid] > 0 {
		return
	}
	delete(w.marked, fsid)
	if err := unix.FanotifyMark(w.fd, unix.FAN_MARK_REMOVE|unix.FAN_MARK_FILESYSTEM, fanMask, fd, ""); err != nil {
		slog.Warn("overlay change tracker: remove the filesystem mark", "error", err)
	}
}

// tracker follows one upper dir for one Store. Fields but mountfd are guarded by w.mu.
type tracker struct {
	w       *watcher
	upper   string
	fsid    string
	mountfd int               // the upper dir, open for resolving handles
	primed  bool              // every change since the last applied scan is known
	epoch   uint64            // bumped when the tracker stops vouching
	applied uint64            // drain generation of the last applied scan
	dirty   map[string]uint64 // path → drain generation of its latest event
	// dirtyPeak is the most dirty paths held since the map was last made (shrink).
	dirtyPeak int
	dirKeys   map[string]bool // registered directory handles
	failed    bool            // registration failed: walk every time
	// inoInHandle: the filesystem's handles carry the inode number in a standard layout
	// (inoOf). Not every filesystem that says so does: tmpfs returns the ino32-gen type with
	// the generation first. So it is checked on the upper dir itself when the tracker opens.
	inoInHandle bool
}

// newTracker returns a tracker for upper, or nil when fanotify is unavailable (the store
// then walks every time).
func newTracker(upper string) *tracker {
	w, err := sharedWatcher()
	if err == nil {
		var t *tracker
		if t, err = w.newTracker(upper); err == nil {
			return t
		}
	}
	slog.Warn("overlay change tracker unavailable: captures walk the whole upper dir", "upper", upper, "error", err)
	return nil
}

func (w *watcher) newTracker(upper string) (*tracker, error) {
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", upper, err)
	}
	fsid, err := fsidOf(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.mark(fd, fsid); err != nil {
		unix.Close(fd)
		return nil, err
	}
	t := &tracker{w: w, upper: upper, fsid: fsid, mountfd: fd, dirty: map[string]uint64{}, dirKeys: map[string]bool{},
		inoInHandle: handleHasIno(fd)}
	w.trackers[t] = true
	t.applied = w.seq
	return t, nil
}

// fsidOf returns the fanotify fsid (statfs f_fsid, as reported in events) of fd's filesystem.
func fsidOf(fd int) (string, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return "", fmt.Errorf("statfs: %w", err)
	}
	b := make([]byte, 8)
	binary.NativeEndian.PutUint32(b, uint32(sfs.Fsid.Val[0]))
	binary.NativeEndian.PutUint32(b[4:], uint32(sfs.Fsid.Val[1]))
	return string(b), nil
}

// mark records a dirty path. Callers hold w.mu. Marks are kept even while the tracker does
// not vouch: the events after a walk's drain stay dirty once that walk primes the tracker.
func (t *tracker) mark(p string, seq uint64) {
	t.dirty[p] = seq
	if len(t.dirty) > dirtyBound() {
		t.distrust("too many changed paths")
	}
}

// distrust drops what the tracker knows until a walk primes it again. Callers hold w.mu.
func (t *tracker) distrust(why string) {
	if t.primed {
		slog.Debug("overlay change tracker resets", "upper", t.upper, "reason", why)
	}
	t.primed = false
	t.epoch++
	t.dirty, t.dirtyPeak = map[string]uint64{}, 0
}

// watch registers the upper directory open as fd at rel, and reports whether it was not
// registered by this tracker at this path before (its content may have changed unseen). It
// runs during walks and for directories a tracked scan looks at.
func (t *tracker) watch(fd int, rel string) bool {
	w := t.w
	h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if !t.failed {
			slog.Warn("overlay change tracker: cannot get a file handle; captures walk the whole upper dir",
				"upper", t.upper, "dir", rel, "error", err)
		}
		t.failed = true
		return true
	}
	key := handleKey(t.fsid, h)
	d := w.dirs[key]
	if d != nil && d.t != t {
		d.t.distrust("directory registered by another store") // it would stop seeing events here
		delete(d.t.dirKeys, key)
	}
	w.dirs[key] = &watchDir{t: t, rel: rel}
	t.dirKeys[key] = true
	return d == nil || d.t != t || d.rel != rel
}

// scanToken ties a scan to the tracker state it was taken from.
type scanToken struct {
	seq   uint64 // drain generation: what was seen up to it is covered by the scan
	epoch uint64
}

// snapshot drains pending events and returns the dirty paths, the changed inodes (as
// records to resolve), the token of the scan that will use them, and whether the tracker
// vouches for them (false: walk).
func (t *tracker) snapshot() (dirty []string, inodes []*inodeRec, tok scanToken, ok bool) {
	w := t.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	w.unquiet() // writes after this raise events again
	tok = scanToken{seq: w.seq, epoch: t.epoch}
	if !t.primed || t.failed {
		return nil, nil, tok, false
	}
	dirty = make([]string, 0, len(t.dirty))
	for p := range t.dirty {
		dirty = append(dirty, p)
	}
	for _, rec := range w.inodes {
		if rec.seq > t.applied && rec.fsid == t.fsid && !rec.gone {
			inodes = append(inodes, rec)
		}
	}
	return dirty, inodes, tok, true
}

// quietSince drains pending events and says what the tracker saw since the scan of tok
// (snapshot), "" when nothing: it still vouches as it did then (no reset, no overflow), and
// no event since named a path it follows or an inode of its filesystem that known (the
// scan's inode numbers) reports true for. The mark sees the whole filesystem, where the
// store, the host and other sandboxes write too; an inode of the upper dir unknown to the
// scan is one created since, and its creation named a path (the upper dir's own metadata
// is put back by every rollback). The caller has frozen the sandbox, so every write the
// sandbox completed is queued by now.
func (t *tracker) quietSince(tok scanToken, known func(ino uint64) bool) string {
	recs, why := t.changedSince(tok)
	if why != "" || len(recs) == 0 {
		return why
	}
	inos, err := t.resolve(recs)
	if err != nil {
		return err.Error()
	}
	for ino := range inos {
		if known(ino) {
			return fmt.Sprintf("a change to inode %d of the upper dir", ino)
		}
	}
	return ""
}

// changedSince drains pending events and returns the inodes of t's filesystem changed since
// tok, or why t saw a change (a reset, a path it follows) without looking at inodes.
func (t *tracker) changedSince(tok scanToken) ([]*inodeRec, string) {
	w := t.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	if t.failed || t.epoch != tok.epoch {
		return nil, "the change tracker was reset"
	}
	for p, seq := range t.dirty {
		if seq > tok.seq {
			return nil, "a change to " + p
		}
	}
	var recs []*inodeRec
	for _, rec := range w.inodes {
		if rec.fsid == t.fsid && rec.seq > tok.seq {
			recs = append(recs, rec)
		}
	}
	return recs, ""
}

// Handle types whose layout the kernel fixes for every filesystem using them (exportfs.h):
// the inode number comes first.
const (
	fileidIno32Gen       = 1
	fileidIno32GenParent = 2
	fileidIno64Gen       = 0x81
	fileidIno64GenParent = 0x82
)

// handleHasIno reports whether fd's handle carries its inode number where inoOf reads it.
func handleHasIno(fd int) bool {
	h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	var st unix.Stat_t
	if err != nil || unix.Fstat(fd, &st) != nil {
		return false
	}
	ino, ok := inoOf(h)
	return ok && ino == st.Ino
}

// inoOf reads the inode number out of a handle of a standard layout.
func inoOf(h unix.FileHandle) (uint64, bool) {
	b := h.Bytes()
	switch h.Type() {
	case fileidIno32Gen, fileidIno32GenParent:
		if len(b) >= 8 {
			return uint64(binary.NativeEndian.Uint32(b)), true
		}
	case fileidIno64Gen, fileidIno64GenParent:
		if len(b) >= 12 {
			return binary.NativeEndian.Uint64(b), true
		}
	}
	return 0, false
}

// resolve returns the inode numbers of changed inodes: read from the handle when its layout
// is standard, else by opening it (a deleted inode is left out). Handles resolved once are
// not resolved again (a handle names one inode for good). An inode number may be of a file
// deleted since, or of another directory tree on the filesystem: the scan stats the indexed
// paths of these numbers, which tells.
func (t *tracker) resolve(recs []*inodeRec) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	for _, rec := range recs {
		if ino, ok := inoOf(rec.handle); ok && t.inoInHandle {
			out[ino] = true
			continue
		}
		t.w.mu.Lock()
		ino, gone := rec.ino, rec.gone
		t.w.mu.Unlock()
		if ino == 0 && !gone {
			fd, err := openByHandle(t.mountfd, rec.handle)
			switch {
			case errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT):
				gone = true // deleted: nothing of it is left to capture
			case err != nil:
				return nil, fmt.Errorf("resolve a changed inode (handle type %d, %d bytes %x): %w", rec.handle.Type(), len(rec.handle.Bytes()), rec.handle.Bytes(), err)
			default:
				var st unix.Stat_t
				err = unix.Fstat(fd, &st)
				unix.Close(fd)
				if err != nil {
					return nil, fmt.Errorf("stat a changed inode: %w", err)
				}
				ino = st.Ino
			}
			t.w.mu.Lock()
			rec.ino, rec.gone = ino, gone
			t.w.mu.Unlock()
		}
		if !gone {
			out[ino] = true
		}
	}
	return out, nil
}

// openByHandle opens a handle O_PATH. ext4 answers ENOMEM (its inode lookup finds nothing
// to return) for an inode whose eviction is under way, which only takes a moment: it is
// retried a few times before it counts as a failure.
func openByHandle(mountfd int, h unix.FileHandle) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.OpenByHandleAt(mountfd, h, unix.O_PATH|unix.O_CLOEXEC)
		if !errors.Is(err, unix.ENOMEM) || i == 5 {
			return fd, err
		}
		time.Sleep(time.Duration(50<<i) * time.Microsecond)
	}
}

// commit is called when a scan is committed to the index: the dirty paths it covered are
// clean, and a walk primes the tracker unless it stopped vouching since the scan began.
func (t *tracker) commit(tok scanToken, walked bool) {
	w := t.w
	w.mu.Lock()
	defer w.mu.Unlock()
	before := len(t.dirty)
	for p, s := range t.dirty {
		if s <= tok.seq {
			delete(t.dirty, p)
		}
	}
	t.dirty = shrink(t.dirty, before, &t.dirtyPeak)
	t.applied = max(t.applied, tok.seq)
	if walked && !t.failed && t.epoch == tok.epoch {
		t.primed = true
	}
	w.prune()
}

// touch marks paths dirty now (a rollback's writes, checked again by the next capture).
func (t *tracker) touch(paths []string) {
	w := t.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	for _, p := range paths {
		t.mark(p, w.seq)
	}
}

// close unregisters the tracker.
func (t *tracker) close() {
	w := t.w
	w.mu.Lock()
	for key := range t.dirKeys {
		if d := w.dirs[key]; d != nil && d.t == t {
			delete(w.dirs, key)
		}
	}
	clear(t.dirKeys)
	t.primed = false
	delete(w.trackers, t)
	w.unmark(t.mountfd, t.fsid)
	w.prune()
	w.mu.Unlock()
	unix.Close(t.mountfd)
}
