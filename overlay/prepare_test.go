//go:build linux

package overlay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// prepare prepares a rollback of f to id with the open files open.
func (f *fixture) prepare(t *testing.T, id string, open OpenFiles) *PreparedRollback {
	t.Helper()
	p, err := f.s.PrepareRollback(context.Background(), RollbackRequest{Merged: f.merged, Upper: f.upper,
		Lower: []string{f.lower}, Target: id, Open: open})
	if err != nil {
		t.Fatalf("prepare rollback to %s: %v", id, err)
	}
	return p
}

// TestPreparedRollbackAppliesThePlan: with nothing changed between the preparation and the
// rollback, the plan made before is applied as it is (no scan in the window) and the tree is
// the target's, every change kind undone; the store works on after it.
func TestPreparedRollbackAppliesThePlan(t *testing.T) {
	f := newTmpfsFixture(t, standardLower)
	f.capture(t, "c0", L1)
	base := walkTree(t, f.merged)
	applyEveryChangeKind(t, f)
	f.capture(t, "c1", L1)
	putFile(t, f.m("data/a.txt"), "uncaptured")
	putFile(t, f.m("more/new.txt"), "uncaptured")

	p := f.prepare(t, "c0", OpenFiles{})
	res, err := p.Rollback(context.Background(), OpenFiles{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Prepared {
		t.Fatalf("nothing changed since the preparation, yet the rollback was worked out again (%s): %+v", res.Phases.Replanned, res.Phases)
	}
	assertTree(t, base, walkTree(t, f.merged), true)
	if f.s.Head() != "c0" {
		t.Fatalf("head %s, want c0", f.s.Head())
	}
	putFile(t, f.m("keep/k.txt"), "after")
	if got := f.capture(t, "c2", L1); !contains(got.Paths, "keep/k.txt") {
		t.Fatalf("capture after a prepared rollback missed keep/k.txt: %v", got.Paths)
	}
}

// TestPreparedRollbackSeesLaterChanges: whatever the sandbox changes between the preparation
// and its freeze, the rollback is worked out again in the window and undoes it too.
func TestPreparedRollbackSeesLaterChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, f *fixture)
	}{
		{"a file the plan rewrites", func(t *testing.T, f *fixture) { putFile(t, f.m("data/a.txt"), "again") }},
		{"a file unchanged since the target", func(t *testing.T, f *fixture) { putFile(t, f.m("keep/k.txt"), "later") }},
		{"a new directory", func(t *testing.T, f *fixture) { putFile(t, f.m("late/dir/x"), "x") }},
		{"a removed lower file", func(t *testing.T, f *fixture) { must(t, os.Remove(f.m("data/sub/c.txt"))) }},
		{"a mode", func(t *testing.T, f *fixture) { must(t, os.Chmod(f.m("etc/hosts"), 0o600)) }},
		{"a renamed directory", func(t *testing.T, f *fixture) { must(t, os.Rename(f.m("more"), f.m("moved"))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTmpfsFixture(t, standardLower)
			f.capture(t, "c0", L1)
			base := walkTree(t, f.merged)
			putFile(t, f.m("data/a.txt"), "changed")
			putFile(t, f.m("more/new.txt"), "new")

			p := f.prepare(t, "c0", OpenFiles{})
			tc.change(t, f)
			res, err := p.Rollback(context.Background(), OpenFiles{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			assertTree(t, base, walkTree(t, f.merged), true)
			if res.Prepared {
				t.Fatal("the sandbox changed the tree after the preparation, yet the prepared plan was applied")
			}
			if res.Phases.Replanned == "" {
				t.Fatal("a prepared plan worked out again, and the phases do not say why")
			}
		})
	}
}

// TestPreparedRollbackIgnoresOtherTrees: the tracker's mark sees the whole filesystem; writes
// outside the upper dir (the store's own files, the host's, another sandbox's) since the
// preparation do not make the rollback work the plan out again in the window.
func TestPreparedRollbackIgnoresOtherTrees(t *testing.T) {
	f := newTmpfsFixture(t, standardLower)
	f.capture(t, "c0", L1)
	base := walkTree(t, f.merged)
	putFile(t, f.m("data/a.txt"), "changed")
	elsewhere := filepath.Join(filepath.Dir(f.upper), "elsewhere")
	must(t, os.Mkdir(elsewhere, 0o755))
	putFile(t, filepath.Join(elsewhere, "old"), "x")

	p := f.prepare(t, "c0", OpenFiles{})
	putFile(t, filepath.Join(elsewhere, "new"), "on the same filesystem")
	putFile(t, filepath.Join(elsewhere, "old"), "rewritten")
	must(t, os.Chmod(filepath.Join(elsewhere, "old"), 0o600))
	must(t, os.Chmod(f.merged, 0o700)) // the root's metadata is put back by every rollback
	res, err := p.Rollback(context.Background(), OpenFiles{}, nil)
	must(t, err)
	if !res.Prepared {
		t.Fatalf("writes outside the upper dir made the rollback work the plan out again: %s", res.Phases.Replanned)
	}
	assertTree(t, base, walkTree(t, f.merged), true)
}

// TestPreparedRollbackOpenFiles: the open files are part of what the plan depends on. A file
// written through a shared mapping made and removed after the preparation (its descriptor
// still open) raises no event; its stat moved, so the rollback is worked out again and
// restores it, whether the preparation knew the file open or not. A file mapped shared in the
// window that the preparation did not plan as mapped does the same.
func TestPreparedRollbackOpenFiles(t *testing.T) {
	open := OpenFiles{Writable: []string{"/data/m.bin"}}
	for _, prepared := range []OpenFiles{open, {}} {
		f := newTmpfsFixture(t, standardLower)
		putFile(t, f.m("data/m.bin"), "original content")
		f.capture(t, "c0", L1)
		base := walkTree(t, f.merged)
		putFile(t, f.m("data/a.txt"), "changed")

		fd, err := unix.Open(f.m("data/m.bin"), unix.O_RDWR|unix.O_CLOEXEC, 0)
		must(t, err)
		must(t, unix.Fsync(fd)) // its pages clean: the first write through a mapping moves the mtime
		p := f.prepare(t, "c0", prepared)
		mem, err := unix.Mmap(fd, 0, 8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		must(t, err)
		copy(mem, "MAPPED!!")
		must(t, unix.Munmap(mem))
		res, err := p.Rollback(context.Background(), open, nil)
		must(t, err)
		unix.Close(fd)
		assertTree(t, base, walkTree(t, f.merged), true)
		if res.Prepared {
			t.Fatalf("a file open for writing was written through a mapping after the preparation (prepared with %+v), yet the prepared plan was applied", prepared)
		}

		putFile(t, f.m("data/a.txt"), "changed")
		p = f.prepare(t, "c0", OpenFiles{})
		res, err = p.Rollback(context.Background(), OpenFiles{Mapped: []string{"/data/m.bin"}}, nil)
		must(t, err)
		if res.Prepared {
			t.Fatal("a file mapped shared in the window but not at the preparation, yet the prepared plan was applied")
		}
		assertTree(t, base, walkTree(t, f.merged), true)

		putFile(t, f.m("data/a.txt"), "changed")
		p = f.prepare(t, "c0", OpenFiles{})
		if res, err = p.Rollback(context.Background(), open, nil); err != nil || !res.Prepared {
			why := ""
			if res != nil {
				why = res.Phases.Replanned
			}
			t.Fatalf("a file open for writing and unchanged since the preparation: replanned (%q), %v; want the plan applied", why, err)
		}
		assertTree(t, base, walkTree(t, f.merged), true)
	}
}

// TestPreparedRollbackAbort: an aborted preparation changes nothing and releases the store;
// a prepared rollback applies once. beforeWrite's error stops it with nothing written.
func TestPreparedRollbackAbort(t *testing.T) {
	f := newTmpfsFixture(t, standardLower)
	f.capture(t, "c0", L1)
	base := walkTree(t, f.merged)
	putFile(t, f.m("data/a.txt"), "changed")
	changed := walkTree(t, f.merged)

	p := f.prepare(t, "c0", OpenFiles{})
	p.Abort()
	p.Abort()
	assertTree(t, changed, walkTree(t, f.merged), true)
	if _, err := p.Rollback(context.Background(), OpenFiles{}, nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("rollback of an aborted preparation: %v, want failed precondition", err)
	}

	stop := errors.New("stop")
	p = f.prepare(t, "c0", OpenFiles{})
	if _, err := p.Rollback(context.Background(), OpenFiles{}, func() error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("rollback whose beforeWrite failed: %v", err)
	}
	assertTree(t, changed, walkTree(t, f.merged), true)
	f.rollback(t, "c0") // the store was released
	assertTree(t, base, walkTree(t, f.merged), true)
}
