//go:build linux

package overlay

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestDiff(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	putFile(t, f.m("data/a.txt"), "changed!")
	putFile(t, f.m("new.txt"), "12345")
	must(t, os.Remove(f.m("data/b.txt")))
	f.capture(t, "c1", L1)
	putFile(t, f.m("later.txt"), "uncaptured")

	got := map[string]DiffEntry{}
	d, err := f.s.Diff(t.Context(), "c0", "c1")
	must(t, err)
	for _, e := range d {
		got[e.Path] = e
	}
	want := map[string]DiffEntry{
		"data/a.txt": {Path: "data/a.txt", Change: Modified, Kind: KindFile, Size: 8},
		"new.txt":    {Path: "new.txt", Change: Added, Kind: KindFile, Size: 5},
		"data/b.txt": {Path: "data/b.txt", Change: Deleted, Kind: KindFile, Size: 5},
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: want %+v, got %+v", p, w, got[p])
		}
	}
	if _, ok := got["later.txt"]; ok {
		t.Error("c0..c1 lists an uncaptured change")
	}
	cur, err := f.s.Diff(t.Context(), "c1", "")
	must(t, err)
	if len(cur) == 0 || cur[len(cur)-1].Path != "later.txt" || cur[len(cur)-1].Change != Added {
		t.Fatalf("c1..now: %+v", cur)
	}
}

// TestDiffRoot: a change to the root directory's own metadata shows as "." modified.
func TestDiffRoot(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	must(t, unix.Setxattr(f.merged, "user.note", []byte("x"), 0))
	d, err := f.s.Diff(t.Context(), "c0", "")
	must(t, err)
	if len(d) != 1 || d[0].Path != "." || d[0].Change != Modified {
		t.Fatalf("diff after an xattr on the root: %+v", d)
	}
	f.capture(t, "c1", L1)
	if d, err = f.s.Diff(t.Context(), "c0", "c1"); err != nil || len(d) != 1 || d[0].Path != "." {
		t.Fatalf("diff c0..c1: %+v %v", d, err)
	}
}
