//go:build linux

package overlay

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// mountStack mounts lowers (topmost first) with a fresh upper dir and returns the merged dir.
func mountStack(t testing.TB, readOnly bool, lowers ...string) (merged, upper string) {
	t.Helper()
	base := t.TempDir()
	merged, upper = filepath.Join(base, "merged"), filepath.Join(base, "upper")
	work := filepath.Join(base, "work")
	for _, d := range []string{merged, upper, work} {
		must(t, os.Mkdir(d, 0o755))
	}
	opt := "lowerdir=" + strings.Join(lowers, ":")
	var flags uintptr
	if readOnly {
		flags = unix.MS_RDONLY
	} else {
		opt += fmt.Sprintf(",upperdir=%s,workdir=%s", upper, work)
	}
	opt += ",index=off,redirect_dir=off,metacopy=off"
	if err := unix.Mount("overlay", merged, "overlay", flags, opt); err != nil {
		t.Fatalf("mount overlay %s: %v", opt, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	return merged, upper
}

// withoutRoot drops the root entry and directory mtimes (the lower's own root and the
// directories' mtimes are not part of what a fork shares).
func withoutRoot(tree map[string]nodeInfo) map[string]nodeInfo {
	delete(tree, ".")
	for p, n := range tree {
		if n.Type == "d---------" {
			n.Mtime = 0
			tree[p] = n
		}
	}
	return tree
}

func TestWriteLowerShowsTheCheckpoint(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	applyEveryChangeKind(t, f)
	must(t, unix.Lsetxattr(f.m("new/file.txt"), "user.k", []byte("v"), 0))
	f.capture(t, "c1", L1)
	want := withoutRoot(walkTree(t, f.merged))
	putFile(t, f.m("later.txt"), "after c1") // not in c1

	dst := filepath.Join(t.TempDir(), "lower")
	res, err := f.s.WriteLower(t.Context(), "c1", LowerRequest{Dir: dst})
	must(t, err)
	if res.Entries == 0 {
		t.Fatalf("no entries written: %+v", res)
	}
	// In overlay format: the deleted file is a whiteout, the recreated dir is opaque.
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(dst, "data/b.txt"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("data/b.txt in the lower: mode %o rdev %d, want a 0/0 whiteout", st.Mode, st.Rdev)
	}
	if v, err := getXattr(filepath.Join(dst, "etc/conf"), "trusted.overlay.opaque"); err != nil || string(v) != "y" {
		t.Fatalf("etc/conf opaque flag: %q %v", v, err)
	}

	// Stacked over the image, with an empty upper, it shows exactly c1's merged tree.
	merged, upper := mountStack(t, false, dst, f.lower)
	got := withoutRoot(walkTree(t, merged))
	assertTree(t, want, got, true)
	for _, p := range []string{"data/b.txt", "etc/conf/app.ini", "later.txt"} {
		if _, err := os.Lstat(filepath.Join(merged, p)); !os.IsNotExist(err) {
			t.Errorf("%s shows in the fork: %v", p, err)
		}
	}
	// A write in the stacked tree lands in its own upper dir, never in the shared layer.
	putFile(t, filepath.Join(merged, "data/a.txt"), "fork's own")
	if b, _ := os.ReadFile(filepath.Join(dst, "data/a.txt")); string(b) != "alpha modified, longer" {
		t.Fatalf("shared layer changed by a fork's write: %q", b)
	}
	if _, err := os.Stat(filepath.Join(upper, "data/a.txt")); err != nil {
		t.Fatalf("the fork's write is not in its upper: %v", err)
	}
}

func TestWriteLowerMovesOwners(t *testing.T) {
	const host, size = 1 << 20, 65536
	f := newFixture(t, standardLower, WithLowerIDs(host, size))
	f.capture(t, "c0", L1)
	putFile(t, f.m("w/mine"), "x")
	must(t, os.Lchown(f.m("w"), host, host))
	must(t, os.Lchown(f.m("w/mine"), host+5, host+7))
	f.capture(t, "c1", L1)

	dst := filepath.Join(t.TempDir(), "lower")
	_, err := f.s.WriteLower(t.Context(), "c1", LowerRequest{Dir: dst}) // the sandbox's own ids
	must(t, err)
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(dst, "w/mine"), &st))
	if st.Uid != 5 || st.Gid != 7 {
		t.Fatalf("owner in the lower: %d:%d, want 5:7", st.Uid, st.Gid)
	}
	dst2 := filepath.Join(t.TempDir(), "lower")
	_, err = f.s.WriteLower(t.Context(), "c1", LowerRequest{Dir: dst2, IDs: &IDRange{Host: 2 << 20, Size: size}})
	must(t, err)
	must(t, unix.Lstat(filepath.Join(dst2, "w/mine"), &st))
	if st.Uid != 2<<20+5 || st.Gid != 2<<20+7 {
		t.Fatalf("owner in the lower moved to another range: %d:%d", st.Uid, st.Gid)
	}
}

func TestWriteLowerRefusesDevices(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	must(t, os.MkdirAll(f.m("w"), 0o755))
	must(t, unix.Mknod(f.m("w/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	f.capture(t, "c1", L1)
	dst := filepath.Join(t.TempDir(), "lower")
	_, err := f.s.WriteLower(t.Context(), "c1", LowerRequest{Dir: dst})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a checkpoint with a device node: %v, want failed_precondition", err)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Fatalf("the refused layer was left behind: %v", err)
	}
}

func TestWriteLowerDoesNotFollowSymlinks(t *testing.T) {
	host := t.TempDir() // a host directory the sandbox points at
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	must(t, os.MkdirAll(f.m("esc"), 0o755))
	must(t, os.Symlink(host, f.m("esc/dir")))
	must(t, os.Symlink(filepath.Join(host, "planted"), f.m("esc/file")))
	putFile(t, f.m("esc/real/x"), "x")
	f.capture(t, "c1", L1)
	dst := filepath.Join(t.TempDir(), "lower")
	_, err := f.s.WriteLower(t.Context(), "c1", LowerRequest{Dir: dst})
	must(t, err)
	if names, _ := os.ReadDir(host); len(names) != 0 {
		t.Fatalf("WriteLower wrote into the host directory a symlink names: %v", names)
	}
	if target, err := os.Readlink(filepath.Join(dst, "esc/dir")); err != nil || target != host {
		t.Fatalf("esc/dir in the lower: %q %v, want the symlink itself", target, err)
	}
	if _, err := f.s.WriteLower(t.Context(), "c1", LowerRequest{Dir: dst}); err == nil {
		t.Fatal("WriteLower into an existing directory succeeded")
	}
}

// TestFoldedLowerExportsAndForksAgain: a sandbox forked onto a written lower (its store opened
// WithFoldedLower) exports, and writes its own checkpoints as lowers, with the folded files
// in: an export applied to the image, and a second-generation lower stacked over it, both show
// the fork's merged tree.
func TestFoldedLowerExportsAndForksAgain(t *testing.T) {
	src := newFixture(t, standardLower)
	src.capture(t, "c0", L1)
	applyEveryChangeKind(t, src)
	must(t, os.Remove(src.m("new/fifo"))) // the tar round trip keeps it simple
	src.capture(t, "c1", L1)
	shared := filepath.Join(t.TempDir(), "shared")
	_, err := src.s.WriteLower(t.Context(), "c1", LowerRequest{Dir: shared})
	must(t, err)

	merged, upper := mountStack(t, false, shared, src.lower)
	lowers := []string{shared, src.lower}
	fs, err := NewStore(filepath.Join(t.TempDir(), "store"), WithFoldedLower(shared))
	must(t, err)
	defer fs.Close()
	capture := func(id, parent string) {
		_, err := fs.Capture(context.Background(), CaptureRequest{ID: id, Parent: parent, Level: L1, Upper: upper, Lower: lowers})
		must(t, err)
	}
	capture("f0", "")
	putFile(t, filepath.Join(merged, "data/a.txt"), "fork wrote") // over a folded file
	must(t, os.Remove(filepath.Join(merged, "new/file.txt")))     // a folded file deleted
	must(t, os.RemoveAll(filepath.Join(merged, "data/sub")))      // an image dir deleted
	putFile(t, filepath.Join(merged, "fresh/y"), "y")
	capture("f1", "f0")
	want := withoutRoot(walkTree(t, merged))
	wantStacked := maps.Clone(want)

	// The export holds the folded files: applied to a copy of the image it is the fork's tree.
	var buf bytes.Buffer
	must(t, fs.Export(t.Context(), "f1", &buf))
	dir := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", src.lower, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	must(t, Import(t.Context(), bytes.NewReader(buf.Bytes()), dir))
	got := withoutRoot(walkTree(t, dir))
	for p, n := range want { // as in TestExportImportRoundTrip: no trusted.* from a tar
		n.Xattrs = dropTrusted(n.Xattrs)
		if n.Group == p { // a folded hard link whose peer the fork deleted: one path left
			n.Group = ""
		}
		want[p] = n
	}
	for p, n := range got {
		n.Xattrs = dropTrusted(n.Xattrs)
		got[p] = n
	}
	assertTree(t, want, got, false)

	// A fork of the fork: its lower, stacked over the image alone, shows the same tree.
	second := filepath.Join(t.TempDir(), "second")
	_, err = fs.WriteLower(t.Context(), "f1", LowerRequest{Dir: second})
	must(t, err)
	m2, _ := mountStack(t, true, second, src.lower)
	for p, n := range wantStacked {
		if n.Group == p {
			n.Group = ""
			wantStacked[p] = n
		}
	}
	assertTree(t, wantStacked, withoutRoot(walkTree(t, m2)), true)
}

func TestStackStates(t *testing.T) {
	lower := map[string]*Entry{
		"a": {Path: "a", Kind: KindDir}, "a/x": {Path: "a/x", Kind: KindFile},
		"b": {Path: "b", Kind: KindDir, Opaque: true}, "b/y": {Path: "b/y", Kind: KindFile},
		"c": {Path: "c", Kind: KindWhiteout}, "d": {Path: "d", Kind: KindDir}, "d/z": {Path: "d/z", Kind: KindFile},
	}
	upper := map[string]*Entry{
		"a": {Path: "a", Kind: KindDir, Opaque: true}, "a/n": {Path: "a/n", Kind: KindFile}, // hides a/x
		"b": {Path: "b", Kind: KindDir}, "b/m": {Path: "b/m", Kind: KindFile}, // stays opaque
		"c": {Path: "c", Kind: KindDir}, // a dir over a whiteout: opaque
		"d": {Path: "d", Kind: KindWhiteout},
	}
	got := stackStates(lower, upper)
	want := map[string]string{"a": "dir opaque", "a/n": "file", "b": "dir opaque", "b/y": "file", "b/m": "file",
		"c": "dir opaque", "d": "whiteout"}
	if len(got) != len(want) {
		t.Errorf("got %d entries, want %d: %v", len(got), len(want), got)
	}
	for p, w := range want {
		e := got[p]
		if e == nil {
			t.Errorf("%s missing", p)
			continue
		}
		s := string(e.Kind)
		if e.Opaque {
			s += " opaque"
		}
		if s != w {
			t.Errorf("%s: %s, want %s", p, s, w)
		}
	}
	if upper["b"].Opaque || upper["c"].Opaque {
		t.Error("stackStates changed its input")
	}
}
