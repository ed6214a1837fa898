//go:build linux

package overlay

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// Every tracked scan of the tests is checked against a walk of the same upper dir (not in
	// benchmarks, which measure the tracked scan alone).
	if b := flag.Lookup("test.bench"); b == nil || b.Value.String() == "" {
		crossCheckTracking = true
	}
	os.Exit(m.Run())
}

// pathsOf returns a capture's paths as a set.
func pathsOf(res *CaptureResult) map[string]bool {
	out := map[string]bool{}
	for _, p := range res.Paths {
		out[p] = true
	}
	return out
}

// trackedCapture captures and fails unless the change tracker (not a walk) did the scan.
func trackedCapture(t *testing.T, f *fixture, id string, open ...OpenFiles) *CaptureResult {
	t.Helper()
	before := scanCounts.tracked.Load()
	req := CaptureRequest{ID: id, Parent: f.s.Latest(), Level: L1, Upper: f.upper, Lower: []string{f.lower}}
	if len(open) > 0 {
		req.Open = open[0]
	}
	res, err := f.s.Capture(t.Context(), req)
	if err != nil {
		t.Fatalf("capture %s: %v", id, err)
	}
	if scanCounts.tracked.Load() == before {
		t.Fatalf("capture %s walked the upper dir; want a tracked scan", id)
	}
	return res
}

// TestTrackerHardLinkAlias: overlayfs reports changes to a hard-linked file under the name it
// first looked the inode up by, here a name deleted (with its directory) since; the tracker
// finds the change through the inode.
func TestTrackerHardLinkAlias(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	f.capture(t, "c1", L1)                                // primes the tracker
	must(t, os.Link(f.m("etc/conf/app.ini"), f.m("n24"))) // copies the lower file up first
	must(t, os.RemoveAll(f.m("etc/conf")))
	if res := trackedCapture(t, f, "c2"); !pathsOf(res)["n24"] {
		t.Fatalf("c2 lacks the new link n24: %v", res.Paths)
	}
	must(t, os.Chmod(f.m("n24"), 0o600))
	fh, err := os.OpenFile(f.m("n24"), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = fh.WriteString("appended\n")
	must(t, err)
	must(t, fh.Close())
	if res := trackedCapture(t, f, "c3"); !pathsOf(res)["n24"] {
		t.Fatalf("c3 missed the change of n24: %v", res.Paths)
	}
	f.rollback(t, "c2")
	if fi, err := os.Stat(f.m("n24")); err != nil || fi.Mode().Perm() != 0o644 || fi.Size() != int64(len("[a]\nb=1\n")) {
		t.Fatalf("after rollback n24 is %v (%v), want 0644 and the original content", fi, err)
	}
}

// TestTrackerMmapHints: writes through a shared writable mapping produce no event while the
// mapping lives, and a second write to a page still dirty does not even move the mtime; the
// mapped file (WritableFiles of the writing process) is captured whatever its stat says.
func TestTrackerMmapHints(t *testing.T) {
	f := newFixture(t, standardLower)
	must(t, os.WriteFile(f.m("data/mapped"), make([]byte, 4096), 0o644))
	f.capture(t, "c0", L1)
	f.capture(t, "c1", L1)
	fh, err := os.OpenFile(f.m("data/mapped"), os.O_RDWR, 0)
	must(t, err)
	defer fh.Close()
	mem, err := unix.Mmap(int(fh.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	must(t, err)
	defer unix.Munmap(mem)
	waitTimestampsPast(t, time.Now()) // the write's mtime is later than c1's
	copy(mem, "written through the mapping")
	open := WritableFiles([]int{os.Getpid()})
	var rel OpenFiles // the test's paths are host paths; a sandbox's are relative to its root
	for _, p := range open.Mapped {
		if r, ok := strings.CutPrefix(p, f.merged+"/"); ok {
			rel.Mapped = append(rel.Mapped, r)
		}
	}
	if !slices.Contains(rel.Mapped, "data/mapped") {
		t.Fatalf("WritableFiles misses the mapped file: %+v", open)
	}
	if res := trackedCapture(t, f, "c2", rel); !pathsOf(res)["data/mapped"] {
		t.Fatalf("c2 missed the write through the mapping: %v", res.Paths)
	}
	var before unix.Stat_t
	must(t, unix.Stat(f.m("data/mapped"), &before))
	copy(mem, "WRITTEN AGAIN, same page, no fault")
	var after unix.Stat_t
	must(t, unix.Stat(f.m("data/mapped"), &after))
	if after.Mtim != before.Mtim {
		t.Logf("the second write moved the mtime (page written back in between?)")
	}
	if res := trackedCapture(t, f, "c3", rel); !pathsOf(res)["data/mapped"] {
		t.Fatalf("c3 missed the second write through the mapping: %v", res.Paths)
	}
	f.rollback(t, "c2")
	if got := string(mem[:27]); got != "written through the mapping" {
		t.Fatalf("after rollback the mapping reads %q", got)
	}
}

// TestTrackerStoresApart: two stores track two upper dirs at once; each capture sees its
// own changes only.
func TestTrackerStoresApart(t *testing.T) {
	a, b := newFixture(t, standardLower), newFixture(t, standardLower)
	for _, f := range []*fixture{a, b} {
		f.capture(t, "c0", L1)
		f.capture(t, "c1", L1)
	}
	must(t, os.WriteFile(a.m("data/only-a"), []byte("a"), 0o644))
	must(t, os.WriteFile(b.m("keep/only-b"), []byte("b"), 0o644))
	ra, rb := trackedCapture(t, a, "c2"), trackedCapture(t, b, "c2")
	if p := pathsOf(ra); !p["data/only-a"] || p["keep/only-b"] {
		t.Fatalf("store a captured %v", ra.Paths)
	}
	if p := pathsOf(rb); !p["keep/only-b"] || p["data/only-a"] {
		t.Fatalf("store b captured %v", rb.Paths)
	}
}

// fsMarks counts the filesystem marks of the process's fanotify group (from its fdinfo).
func fsMarks(t *testing.T) int {
	t.Helper()
	w, err := sharedWatcher()
	must(t, err)
	data, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", w.fd))
	must(t, err)
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "fanotify sdev:") {
			n++
		}
	}
	return n
}

// TestTrackerUnmarksWhenIdle: the filesystem mark exists while a store tracks an upper dir on
// it and goes with the last one, so an idle daemon costs the host's writes nothing.
func TestTrackerUnmarksWhenIdle(t *testing.T) {
	before := fsMarks(t)
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	if got := fsMarks(t); got != 1 {
		t.Fatalf("%d filesystem marks while tracking, want 1 (before: %d)", got, before)
	}
	f.s.Close()
	if got := fsMarks(t); got != 0 {
		t.Fatalf("%d filesystem marks after the last store closed, want 0", got)
	}
}

// TestTrackerShedsIdleStore: when the changed-inode set outgrows its bound, the store that
// has not captured for longest stops vouching (its next capture walks); the busy store keeps
// its tracked captures.
func TestTrackerShedsIdleStore(t *testing.T) {
	defer func(n int64) { maxDirty.Store(n) }(maxDirty.Load())
	maxDirty.Store(256) // host noise (the packs these captures write, other processes) fits in half
	idle, busy := newFixture(t, standardLower), newFixture(t, standardLower)
	for i := 0; i < 200; i++ { // a tree large enough that 40 changes are worth tracking
		must(t, os.WriteFile(busy.m(fmt.Sprintf("keep/base%d", i)), nil, 0o644))
	}
	for _, f := range []*fixture{idle, busy} {
		f.capture(t, "c0", L1)
		f.capture(t, "c1", L1)
	}
	for round := 0; round < 8; round++ {
		for i := 0; i < 40; i++ {
			must(t, os.WriteFile(busy.m(fmt.Sprintf("data/r%d-%d", round, i)), []byte("x"), 0o644))
		}
		if res := trackedCapture(t, busy, fmt.Sprintf("b%d", round)); len(res.Paths) < 40 {
			t.Fatalf("busy capture %d: %v", round, res.Paths)
		}
	}
	must(t, os.WriteFile(idle.m("data/late"), []byte("x"), 0o644))
	walked := scanCounts.walked.Load()
	res := idle.capture(t, "c2", L1)
	if scanCounts.walked.Load() == walked {
		t.Fatal("the idle store's capture did not walk after it was shed")
	}
	if !pathsOf(res)["data/late"] {
		t.Fatalf("idle capture missed data/late: %v", res.Paths)
	}
	must(t, os.WriteFile(idle.m("data/later"), []byte("x"), 0o644))
	if res := trackedCapture(t, idle, "c3"); !pathsOf(res)["data/later"] {
		t.Fatalf("the idle store's tracker did not prime again: %v", res.Paths)
	}
}

// inodeMarks counts the inode marks (the ignore marks of hot files) of the process's group
// on the file at path (the mark sees the whole filesystem: other processes' hot files on it
// get marks too).
func inodeMarks(t *testing.T, path string) int {
	t.Helper()
	w, err := sharedWatcher()
	must(t, err)
	w.mu.Lock()
	w.drain() // let the tracker see the writes so far
	w.mu.Unlock()
	var st unix.Stat_t
	must(t, unix.Stat(path, &st))
	data, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", w.fd))
	must(t, err)
	return strings.Count(string(data), fmt.Sprintf("fanotify ino:%x ", st.Ino))
}

// TestTrackerQuietsHotFiles: a file written many times between two checkpoints gets its
// write events ignored until the next capture, which still records it; after that capture
// its writes (even a truncate by path, which raises a write event only) are seen again.
func TestTrackerQuietsHotFiles(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	f.capture(t, "c1", L1)
	fh, err := os.OpenFile(f.m("data/hot"), os.O_CREATE|os.O_WRONLY, 0o644)
	must(t, err)
	// Queued events of one file merge, so it takes writes in hotWrites drain batches to make a
	// file hot; inodeMarks drains synchronously, so every write of the loop is its own batch.
	hot := filepath.Join(f.upper, "data/hot")
	for i := 0; inodeMarks(t, hot) == 0; i++ {
		if i == 8*hotWrites { // a loaded machine may batch more writes into one event
			t.Fatalf("no ignore mark on a file written %d times, each write drained", i)
		}
		_, err = fh.WriteString("line\n") // one event: inodeMarks drained the previous one
		must(t, err)
	}
	_, err = fh.WriteString("written while quiet\n")
	must(t, err)
	must(t, fh.Close())
	if res := trackedCapture(t, f, "c2"); !pathsOf(res)["data/hot"] {
		t.Fatalf("c2 missed the hot file: %v", res.Paths)
	}
	if n := inodeMarks(t, hot); n != 0 {
		t.Fatalf("%d ignore marks left after a capture", n)
	}
	waitTimestampsPast(t, time.Now()) // the truncate's mtime is later than c2's
	must(t, os.Truncate(f.m("data/hot"), 3))
	if res := trackedCapture(t, f, "c3"); !pathsOf(res)["data/hot"] {
		t.Fatalf("c3 missed a truncate of the once hot file: %v", res.Paths)
	}
}

// waitTimestampsPast waits until the timestamps the kernel gives files are later than t0:
// they come from a coarse clock that lags time.Now by up to a tick, so a file written right
// after a capture may carry the capture's own time.
func waitTimestampsPast(t *testing.T, t0 time.Time) {
	t.Helper()
	probe := t.TempDir() + "/tick"
	testutil.WaitFor(t, time.Second, time.Millisecond, "file timestamps to pass "+t0.String(), func() bool {
		must(t, os.WriteFile(probe, nil, 0o600))
		st, err := os.Stat(probe)
		must(t, err)
		return st.ModTime().After(t0)
	})
}

// TestTrackerResolvesHandles: a changed inode's handle resolves to its inode number on ext4
// and on tmpfs, whose handles are of the ino32-gen type but hold the generation first (read
// as the number, it named no file, so a change seen only by inode was missed there).
func TestTrackerResolvesHandles(t *testing.T) {
	for _, fs := range []string{"ext4", "tmpfs"} {
		t.Run(fs, func(t *testing.T) {
			var f *fixture
			if fs == "tmpfs" {
				f = newTmpfsFixture(t, standardLower)
			} else {
				f = newFixture(t, standardLower)
			}
			f.capture(t, "c0", L1)
			trk := f.s.trk
			if trk == nil {
				t.Fatal("no change tracker after a capture")
			}
			putFile(t, f.m("data/new.txt"), "x")
			h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, filepath.Join(f.upper, "data/new.txt"), 0)
			must(t, err)
			var st unix.Stat_t
			must(t, unix.Stat(filepath.Join(f.upper, "data/new.txt"), &st))
			inos, err := trk.resolve([]*inodeRec{{fsid: trk.fsid, handle: h}})
			must(t, err)
			if !inos[st.Ino] || len(inos) != 1 {
				t.Fatalf("handle of inode %d resolved to %v", st.Ino, inos)
			}
		})
	}
}

// TestShrinkMaps: a map that held many entries and now holds an eighth or less is copied to
// one of its size, with the same entries (a range over the old one would still visit every
// bucket it grew); smaller maps, and maps still near their peak, stay as they are.
func TestShrinkMaps(t *testing.T) {
	same := func(a, b map[int]int) bool {
		return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
	}
	m, peak := map[int]int{}, 0
	for i := range 5000 {
		m[i] = i
	}
	before := len(m)
	for i := 10; i < 5000; i++ {
		delete(m, i)
	}
	got := shrink(m, before, &peak)
	if same(got, m) || len(got) != 10 || peak != 10 {
		t.Fatalf("after 4,990 of 5,000 deleted: copied %v, %d entries, peak %d; want a copy of 10, peak 10", !same(got, m), len(got), peak)
	}
	for i := range 10 {
		if got[i] != i {
			t.Fatalf("entry %d: %d", i, got[i])
		}
	}
	half, hp := map[int]int{}, 0
	for i := range 1000 {
		half[i] = i
	}
	for i := range 500 {
		delete(half, i)
	}
	if !same(shrink(half, 1000, &hp), half) || hp != 1000 {
		t.Fatal("a map at half its peak was copied")
	}
	small, sp := map[int]int{1: 1}, 0
	if !same(shrink(small, 100, &sp), small) {
		t.Fatal("a map that never held 256 entries was copied")
	}
}
