//go:build linux

package overlay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRollbackRestoresEachChangeKind(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	base := walkTree(t, f.merged)
	applyEveryChangeKind(t, f)
	f.capture(t, "c1", L1)
	afterC1 := walkTree(t, f.merged)

	// Uncaptured changes on top of c1, each kind again, undone by rolling back to c1.
	putFile(t, f.m("new/file.txt"), "rewritten")
	must(t, os.Remove(f.m("new/link")))
	must(t, os.Symlink("elsewhere", f.m("new/link")))
	must(t, os.Chmod(f.m("data/a.txt"), 0o600))
	must(t, unix.Lsetxattr(f.m("data/sub/c.txt"), "user.tag", []byte("v2"), 0))
	must(t, unix.Lremovexattr(f.m("keep/k.txt"), "trusted.note"))
	must(t, os.RemoveAll(f.m("etc/conf")))
	must(t, os.RemoveAll(f.m("data/sub")))
	must(t, os.Remove(f.m("etc/hosts.link")))
	must(t, os.Mkdir(f.m("etc/hosts.link"), 0o755))
	must(t, os.Chtimes(f.m("keep"), time.Unix(1, 0), time.Unix(1, 0)))
	res := f.rollback(t, "c1")
	if res.FilesRestored == 0 || res.FilesRestored != len(res.Paths) {
		t.Fatalf("rollback result %+v", res)
	}
	assertTree(t, afterC1, walkTree(t, f.merged), true)

	// Back to the start, across a stored checkpoint: lower content comes back.
	back := f.rollback(t, "c0")
	assertTree(t, base, walkTree(t, f.merged), true)
	if got := f.s.Checkpoints(); len(got) != 2 || f.s.Head() != "c0" {
		t.Fatalf("rollback must keep the later checkpoints and make c0 the head, have %v head %s", got, f.s.Head())
	}
	// The index follows the rolled-back upper dir: the next L1 records the new change and, at
	// most, paths the rollback rewrote (as the upper dir now represents them), nothing else.
	putFile(t, f.m("keep/k.txt"), "after")
	res2 := f.capture(t, "c1b", L1)
	if !contains(res2.Paths, "keep/k.txt") {
		t.Fatalf("capture after rollback missed keep/k.txt: %v", res2.Paths)
	}
	for _, p := range res2.Paths {
		if p != "keep" && p != "keep/k.txt" && !coveredBy(back.Paths, p) {
			t.Fatalf("capture after rollback recorded unrelated path %q (all: %v)", p, res2.Paths)
		}
	}
}

func TestRollbackIsNotFooledBySymlinkEscape(t *testing.T) {
	f := newFixture(t, standardLower)
	host := t.TempDir()
	canary := filepath.Join(host, "canary")
	must(t, os.WriteFile(canary, []byte("do not touch"), 0o644))
	old := time.Unix(1_000_000, 0)
	must(t, os.Chtimes(canary, old, old))
	must(t, os.Chtimes(host, old, old))

	putFile(t, f.m("work/dir/inner.txt"), "inner")
	putFile(t, f.m("work/dir/canary"), "sandbox's own canary")
	f.capture(t, "c0", L1)
	want := walkTree(t, f.merged)

	// Between checkpoints the sandbox swaps directories for symlinks to the host.
	must(t, os.RemoveAll(f.m("work/dir")))
	must(t, os.Symlink(host, f.m("work/dir")))
	must(t, os.RemoveAll(f.m("data/sub")))
	must(t, os.Symlink(host, f.m("data/sub")))
	f.capture(t, "c1", L1)
	must(t, os.Remove(f.m("work/dir")))
	must(t, os.Symlink("../../../../../../../.."+host, f.m("work/dir")))

	f.rollback(t, "c0")
	assertTree(t, want, walkTree(t, f.merged), true)
	got, err := os.ReadFile(canary)
	must(t, err)
	st, err := os.Stat(canary)
	must(t, err)
	hst, err := os.Stat(host)
	must(t, err)
	entries, err := os.ReadDir(host)
	must(t, err)
	if string(got) != "do not touch" || !st.ModTime().Equal(old) || !hst.ModTime().Equal(old) || len(entries) != 1 {
		t.Fatalf("host dir touched: content %q mtime %v dir mtime %v entries %d", got, st.ModTime(), hst.ModTime(), len(entries))
	}
}

func TestDeleteKeepsLaterCheckpointsRestorable(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	putFile(t, f.m("a/one.txt"), "one")
	putFile(t, f.m("data/a.txt"), "A1")
	f.capture(t, "c1", L1)
	putFile(t, f.m("a/two.txt"), "two")
	must(t, os.Remove(f.m("data/b.txt")))
	f.capture(t, "c2", L1)
	want := walkTree(t, f.merged)
	putFile(t, f.m("a/three.txt"), "three")
	f.capture(t, "c3", L1)

	must(t, f.s.Delete(t.Context(), "c1"))
	must(t, f.s.Delete(t.Context(), "c0"))
	f.reopen(t)
	if got := f.s.Checkpoints(); len(got) != 2 || got[0] != "c2" {
		t.Fatalf("after deletes: %v", got)
	}
	f.rollback(t, "c2")
	assertTree(t, want, walkTree(t, f.merged), true)
}

func TestRollbackUnknownTarget(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	_, err := f.s.Rollback(t.Context(), RollbackRequest{Merged: f.merged, Upper: f.upper, Target: "missing"})
	if err == nil {
		t.Fatal("rollback to a missing checkpoint succeeded")
	}
	_, err = f.s.Rollback(t.Context(), RollbackRequest{Merged: f.upper, Upper: f.upper, Target: "c0"})
	if err == nil {
		t.Fatal("rollback through a non-overlay dir succeeded")
	}
}

// coveredBy reports whether p is one of paths or an ancestor of one.
func coveredBy(paths []string, p string) bool {
	for _, q := range paths {
		if q == p || strings.HasPrefix(q, p+"/") {
			return true
		}
	}
	return false
}

// TestDeferredRollbackRecord: a Deferred rollback moves the head in memory only; a crash
// (reopen) before PersistRollback finds the old head on disk, and rolling back again reaches
// the target; once persisted, the target is the head across a reopen; a capture on top of an
// unwritten record writes it first, so the capture's manifest never names a missing record.
func TestDeferredRollbackRecord(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	want := walkTree(t, f.merged)
	putFile(t, f.m("data/a.txt"), "one")
	f.capture(t, "c1", L1)
	deferred := func(target string) {
		t.Helper()
		putFile(t, f.m("data/b.txt"), "uncaptured")
		_, err := f.s.Rollback(t.Context(), RollbackRequest{Merged: f.merged, Upper: f.upper, Lower: []string{f.lower},
			Target: target, Meta: []byte(`{"to":"` + target + `"}`), Deferred: true})
		must(t, err)
		if f.s.Head() != target {
			t.Fatalf("head after a deferred rollback %s, want %s", f.s.Head(), target)
		}
	}
	deferred("c0")
	f.reopen(t) // killed before the record was written
	if f.s.Head() != "c1" || f.s.HeadMeta() != nil {
		t.Fatalf("after a crash before the record: head %s meta %s, want c1", f.s.Head(), f.s.HeadMeta())
	}
	deferred("c0") // the redo
	assertTree(t, want, walkTree(t, f.merged), true)
	must(t, f.s.PersistRollback())
	must(t, f.s.PersistRollback()) // nothing left to write
	f.reopen(t)
	if f.s.Head() != "c0" || string(f.s.HeadMeta()) != `{"to":"c0"}` {
		t.Fatalf("after the record: head %s meta %s, want c0", f.s.Head(), f.s.HeadMeta())
	}
	assertTree(t, want, walkTree(t, f.merged), true)
	deferred("c1")
	putFile(t, f.m("data/c.txt"), "captured")
	f.capture(t, "c2", L1)
	f.reopen(t)
	if f.s.Head() != "c2" {
		t.Fatalf("after a capture on an unwritten rollback and a reopen: head %s, want c2", f.s.Head())
	}
	if p, err := f.s.Parent("c2"); err != nil || p != "c1" {
		t.Fatalf("parent of c2 = %q, %v; want c1", p, err)
	}
}

// TestWriteRollbackUnsynced: a Deferred rollback's record put in place by WriteRollback
// (no sync) makes the target the head for a process that opens the store after a kill
// (the page cache holds it); PersistRollback then only syncs it. A record cut by a power
// loss (its data lost, the rename kept) is ignored at open: the last capture is the head.
func TestWriteRollbackUnsynced(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	want := walkTree(t, f.merged)
	putFile(t, f.m("data/a.txt"), "one")
	f.capture(t, "c1", L1)
	_, err := f.s.Rollback(t.Context(), RollbackRequest{Merged: f.merged, Upper: f.upper, Lower: []string{f.lower},
		Target: "c0", Meta: []byte(`{"to":"c0"}`), Deferred: true})
	must(t, err)
	must(t, f.s.WriteRollback())
	if !f.s.unsynced || f.s.unwritten {
		t.Fatalf("after WriteRollback: unsynced %v unwritten %v", f.s.unsynced, f.s.unwritten)
	}
	f.reopen(t) // killed before the sync
	if f.s.Head() != "c0" || string(f.s.HeadMeta()) != `{"to":"c0"}` {
		t.Fatalf("after a kill between WriteRollback and its sync: head %s meta %s, want c0", f.s.Head(), f.s.HeadMeta())
	}
	must(t, f.s.SyncRollback())
	assertTree(t, want, walkTree(t, f.merged), true)
	_, err = f.s.Rollback(t.Context(), RollbackRequest{Merged: f.merged, Upper: f.upper, Lower: []string{f.lower},
		Target: "c1", Deferred: true})
	must(t, err)
	must(t, f.s.WriteRollback())
	must(t, f.s.PersistRollback())
	if f.s.unsynced || f.s.unwritten {
		t.Fatalf("after PersistRollback: unsynced %v unwritten %v", f.s.unsynced, f.s.unwritten)
	}
	_, err = f.s.Rollback(t.Context(), RollbackRequest{Merged: f.merged, Upper: f.upper, Lower: []string{f.lower},
		Target: "c0", Deferred: true})
	must(t, err)
	must(t, f.s.WriteRollback())
	// a power loss kept the rename, not the data
	must(t, os.WriteFile(filepath.Join(f.storeDir, rollbackFile), nil, 0o600))
	f.reopen(t)
	if f.s.Head() != "c1" || f.s.HeadMeta() != nil {
		t.Fatalf("after a cut record: head %s meta %s, want the last capture c1", f.s.Head(), f.s.HeadMeta())
	}
}

// TestRollbackRestoresRemovedLowerTree removes a directory of the image with everything
// under it (lower-only subdirectories, which no index names, included), then rolls back:
// every path under it comes back, also where a changed path lies below (its ancestors are
// not taken as unchanged because nothing names them).
func TestRollbackRestoresRemovedLowerTree(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	base := walkTree(t, f.merged)
	must(t, os.RemoveAll(f.m("data")))
	f.rollback(t, "c0")
	assertTree(t, base, walkTree(t, f.merged), true)

	putFile(t, f.m("data/sub/c.txt"), "changed")
	f.capture(t, "c1", L1)
	must(t, os.RemoveAll(f.m("data")))
	f.rollback(t, "c0")
	assertTree(t, base, walkTree(t, f.merged), true)
}
