//go:build linux

package overlay

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// verifyNone fails t unless checkpoint id matches the merged tree exactly.
func verifyNone(t testing.TB, f *fixture, id string, opts ...VerifyOption) {
	t.Helper()
	got, err := f.s.Verify(t.Context(), id, f.merged, opts...)
	must(t, err)
	if len(got) > 0 {
		t.Fatalf("verify %s: %d mismatches, first: %+v", id, len(got), got[:min(len(got), 20)])
	}
}

// mismatchSet renders mismatches as "path what" for comparison.
func mismatchSet(ms []Mismatch) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		out[m.Path+" "+m.What] = true
	}
	return out
}

func TestVerifyAfterCaptureAndRollback(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	verifyNone(t, f, "c0", VerifyMtimes())
	applyEveryChangeKind(t, f)
	f.capture(t, "c1", L1)
	verifyNone(t, f, "c1", VerifyMtimes())

	old, err := f.s.Verify(t.Context(), "c0", f.merged)
	must(t, err)
	got := mismatchSet(old)
	for _, w := range []string{"new extra", "new/file.txt extra", "data/b.txt missing", "bin/tool mode",
		"etc/hosts owner", "data/a.txt size", "data/sub/c.txt xattrs", "keep/k.txt xattrs",
		"etc/conf/app.ini missing", "etc/conf/other.ini extra"} {
		if !got[w] {
			t.Errorf("verify c0 after c1 lacks %q; got %v", w, got)
		}
	}
	f.rollback(t, "c0")
	verifyNone(t, f, "c0", VerifyMtimes())
	f.capture(t, "c2", L2)
	verifyNone(t, f, "c2", VerifyMtimes())
}

func TestVerifyNamesExactlyTheChangedPath(t *testing.T) {
	f := newFixture(t, standardLower)
	putFile(t, f.m("work/upper.txt"), "upper content")
	putFile(t, f.m("work/b.txt"), "b")
	must(t, os.Link(f.m("work/b.txt"), f.m("work/b.link")))
	f.capture(t, "c0", L1)
	f.capture(t, "c1", L1)

	// Same size, new content: only the content differs (lower file copied up, upper rewritten).
	must(t, os.WriteFile(f.m("data/a.txt"), []byte("ALPHA"), 0o644))
	must(t, os.WriteFile(f.m("work/upper.txt"), []byte("UPPER CONTENT"), 0o644))
	ms, err := f.s.Verify(t.Context(), "c0", f.merged)
	must(t, err)
	want := map[string]bool{"data/a.txt content": true, "work/upper.txt content": true}
	if got := mismatchSet(ms); len(got) != len(want) || !got["data/a.txt content"] || !got["work/upper.txt content"] {
		t.Fatalf("verify c0: want %v, got %+v", want, ms)
	}
	if ms[0].Want == ms[0].Got || ms[0].Want == "" {
		t.Fatalf("content mismatch without hashes: %+v", ms[0])
	}

	f.rollback(t, "c1")
	verifyNone(t, f, "c0", VerifyMtimes())
	// A broken hard link with identical content is still a difference.
	must(t, os.Remove(f.m("work/b.link")))
	must(t, os.WriteFile(f.m("work/b.link"), []byte("b"), 0o644))
	ms, err = f.s.Verify(t.Context(), "c1", f.merged)
	must(t, err)
	if got := mismatchSet(ms); len(ms) != 2 || !got["work/b.link link"] || !got["work/b.txt link"] {
		t.Fatalf("verify c1 after breaking a hard link: %+v", ms)
	}
}

func TestVerifySkipsMountsAndRuntimePaths(t *testing.T) {
	f := newFixture(t, standardLower)
	must(t, os.Mkdir(f.m("mnt"), 0o755))
	f.capture(t, "c0", L1)

	putFile(t, f.m(".deltabox/init.sock"), "runtime")
	putFile(t, f.m("proc/1/status"), "pseudo")
	mountForTest(t, "tmpfs", f.m("mnt"), "tmpfs", 0)
	putFile(t, f.m("mnt/inside"), "on another filesystem")
	host := filepath.Join(t.TempDir(), "hosts")
	must(t, os.WriteFile(host, []byte("bind-mounted over a file"), 0o644))
	mountForTest(t, host, f.m("etc/hosts"), "", unix.MS_BIND)
	verifyNone(t, f, "c0")

	ms, err := f.s.Verify(t.Context(), "c0", f.merged, VerifySkip())
	must(t, err)
	got := mismatchSet(ms)
	if !got[".deltabox extra"] || !got["proc extra"] || got["mnt/inside extra"] || got["etc/hosts size"] {
		t.Fatalf("verify with an empty skip list: %v", got)
	}
	if _, err := f.s.Verify(t.Context(), "c0", f.merged, VerifySkip("../etc")); err == nil {
		t.Fatal("verify accepted a skip path outside the tree")
	}
}

// mountForTest mounts src on target, a path the test made itself (checked not to be a
// symlink: mount(2) would follow one), and unmounts it (never following a symlink) before the
// overlay goes.
func mountForTest(t *testing.T, src, target, fstype string, flags uintptr) {
	t.Helper()
	fi, err := os.Lstat(target)
	must(t, err)
	if fi.Mode()&os.ModeSymlink != 0 {
		t.Fatalf("mount target %s is a symlink", target)
	}
	if err := unix.Mount(src, target, fstype, flags, ""); err != nil {
		t.Fatalf("mount %s on %s: %v", src, target, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) })
}

// TestVerifyRoot: a change to the root directory's own metadata is a mismatch at ".".
func TestVerifyRoot(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	must(t, os.Chmod(f.merged, 0o700))
	ms, err := f.s.Verify(t.Context(), "c0", f.merged)
	must(t, err)
	if len(ms) != 1 || ms[0].Path != "." || ms[0].What != "mode" || ms[0].Got != "0700" {
		t.Fatalf("mismatches after chmod of the root: %+v", ms)
	}
	f.rollback(t, "c0")
	verifyNone(t, f, "c0", VerifyMtimes())
}
