//go:build linux

package overlay

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

// TestTreeRollbackAcrossBranches builds a tree (c0 -> c1 -> c2, c0 -> c3 -> c4, c3 -> c5 with
// an L2 on one branch), moves between branches (never only to ancestors), across a reopen,
// and checks the merged tree equals each target's recorded walk and that nothing is deleted.
func TestTreeRollbackAcrossBranches(t *testing.T) {
	f := newFixture(t, standardLower)
	walks := map[string]map[string]nodeInfo{}
	capture := func(id string, l Level) {
		f.capture(t, id, l)
		walks[id] = walkTree(t, f.merged)
	}
	move := func(id string) {
		t.Helper()
		f.rollback(t, id)
		assertTree(t, walks[id], walkTree(t, f.merged), true)
		if f.s.Head() != id {
			t.Fatalf("head %s after rollback to %s", f.s.Head(), id)
		}
		verifyNone(t, f, id, VerifyMtimes())
	}
	capture("c0", L1)
	must(t, os.MkdirAll(f.m("a"), 0o755))
	putFile(t, f.m("a/one.txt"), "branch A 1")
	must(t, os.Remove(f.m("data/a.txt")))
	capture("c1", L1)
	putFile(t, f.m("a/one.txt"), "branch A 2")
	must(t, os.MkdirAll(f.m("a/deep/er"), 0o755))
	putFile(t, f.m("a/deep/er/x"), "x")
	capture("c2", L1)
	move("c0")
	putFile(t, f.m("b.txt"), "branch B")
	must(t, os.MkdirAll(f.m("a"), 0o700))
	must(t, os.Symlink("/etc", f.m("a/one.txt")))
	capture("c3", L1)
	putFile(t, f.m("data/a.txt"), "rewritten on B")
	capture("c4", L2)
	move("c2") // across: c4 -> c3 -> c0 -> c1 -> c2
	move("c4")
	move("c3")
	putFile(t, f.m("c.txt"), "branch C")
	capture("c5", L1)
	f.reopen(t)
	if f.s.Head() != "c5" {
		t.Fatalf("head after reopen: %s", f.s.Head())
	}
	move("c1")
	f.reopen(t)
	if f.s.Head() != "c1" {
		t.Fatalf("head after reopen past a rollback: %s", f.s.Head())
	}
	move("c5")
	move("c4")
	if got := f.s.Checkpoints(); len(got) != 6 {
		t.Fatalf("checkpoints %v: rollback must delete nothing", got)
	}
	// Deleting: a branch point is refused, an inner checkpoint with one child folds into it,
	// a leaf goes alone; the rest stays restorable.
	if err := f.s.Delete(t.Context(), "c3"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete of a branch point: %v", err)
	}
	must(t, f.s.Delete(t.Context(), "c1"))
	if p, _ := f.s.Parent("c2"); p != "c0" {
		t.Fatalf("c2's parent after c1 was folded into it: %q", p)
	}
	must(t, f.s.Delete(t.Context(), "c5"))
	f.reopen(t)
	move("c2")
	move("c4")
	move("c0")
}

// TestTreeInterruptedDelete leaves both packs of a delete that was interrupted after the child
// absorbed its parent: load drops the absorbed pack and the child stays restorable.
func TestTreeInterruptedDelete(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	putFile(t, f.m("x.txt"), "1")
	f.capture(t, "c1", L1)
	putFile(t, f.m("y.txt"), "2")
	f.capture(t, "c2", L1)
	want := walkTree(t, f.merged)
	saved, err := os.ReadFile(filepath.Join(f.storeDir, "c1"+packSuffix))
	must(t, err)
	must(t, f.s.Delete(t.Context(), "c1"))
	must(t, os.WriteFile(filepath.Join(f.storeDir, "c1"+packSuffix), saved, 0o600)) // as if the remove never happened
	f.reopen(t)
	if got := f.s.Checkpoints(); len(got) != 2 {
		t.Fatalf("checkpoints after the interrupted delete: %v", got)
	}
	f.rollback(t, "c0")
	f.rollback(t, "c2")
	assertTree(t, want, walkTree(t, f.merged), true)
}

// TestRestoreIntoAnotherSandbox makes a second overlay (same image) equal a checkpoint of the
// first: its own leftovers go, the checkpoint's files come, nothing in the first store moves.
func TestRestoreIntoAnotherSandbox(t *testing.T) {
	src := newFixture(t, standardLower)
	src.capture(t, "c0", L1)
	must(t, os.MkdirAll(src.m("w/deep"), 0o755))
	putFile(t, src.m("w/deep/f"), "forked content")
	must(t, os.Remove(src.m("data/a.txt")))
	must(t, os.Symlink("/etc", src.m("w/link")))
	src.capture(t, "c1", L1)
	want := walkTree(t, src.merged)
	putFile(t, src.m("w/after"), "not in c1")
	dst := newFixture(t, standardLower)
	putFile(t, dst.m("junk.txt"), "the warm sandbox's own")
	must(t, os.Remove(dst.m("data/b.txt")))
	res, err := src.s.RestoreInto(t.Context(), "c1", RollbackRequest{Merged: dst.merged, Upper: dst.upper, Lower: []string{dst.lower}})
	must(t, err)
	assertTree(t, want, walkTree(t, dst.merged), false) // the two images were made at different times
	if src.s.Head() != "c1" || res.FilesRestored == 0 {
		t.Fatalf("head %s, result %+v", src.s.Head(), res)
	}
	if _, err := os.Stat(src.m("w/after")); err != nil {
		t.Fatal("the source's own tree changed")
	}
}
