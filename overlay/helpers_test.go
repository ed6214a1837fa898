//go:build linux

package overlay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// fixture is a real overlay mount (lower, upper, work, merged under t.TempDir()) and a store.
type fixture struct {
	lower, upper, merged, storeDir string
	s                              *Store
}

func newFixture(t testing.TB, fillLower func(dir string), opts ...Option) *fixture {
	t.Helper()
	testutil.RequiresRoot(t)
	return newFixtureIn(t, t.TempDir(), fillLower, opts...)
}

// newTmpfsFixture is newFixture on a tmpfs of its own: a filesystem that nothing but the test
// writes to (the change tracker reports every write of the filesystem it watches).
func newTmpfsFixture(t testing.TB, fillLower func(dir string), opts ...Option) *fixture {
	t.Helper()
	testutil.RequiresRoot(t)
	base := t.TempDir()
	if err := unix.Mount("tmpfs", base, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(base, unix.MNT_DETACH) })
	return newFixtureIn(t, base, fillLower, opts...)
}

func newFixtureIn(t testing.TB, base string, fillLower func(dir string), opts ...Option) *fixture {
	t.Helper()
	f := &fixture{
		lower: filepath.Join(base, "lower"), upper: filepath.Join(base, "upper"),
		merged: filepath.Join(base, "merged"), storeDir: filepath.Join(base, "store"),
	}
	work := filepath.Join(base, "work")
	for _, d := range []string{f.lower, f.upper, work, f.merged} {
		must(t, os.Mkdir(d, 0o755))
	}
	if fillLower != nil {
		fillLower(f.lower)
	}
	opt := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,redirect_dir=off,metacopy=off", f.lower, f.upper, work)
	if err := unix.Mount("overlay", f.merged, "overlay", 0, opt); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(f.merged, unix.MNT_DETACH) })
	s, err := NewStore(f.storeDir, opts...)
	must(t, err)
	f.s = s
	t.Cleanup(func() { f.s.Close() })
	return f
}

func (f *fixture) capture(t testing.TB, id string, level Level) *CaptureResult {
	t.Helper()
	res, err := f.s.Capture(context.Background(), CaptureRequest{ID: id, Parent: f.s.Latest(), Level: level, Upper: f.upper, Lower: []string{f.lower}})
	if err != nil {
		t.Fatalf("capture %s: %v", id, err)
	}
	return res
}

func (f *fixture) rollback(t testing.TB, id string) *RollbackResult {
	t.Helper()
	res, err := f.s.Rollback(context.Background(), RollbackRequest{Merged: f.merged, Upper: f.upper, Lower: []string{f.lower}, Target: id})
	if err != nil {
		t.Fatalf("rollback %s: %v", id, err)
	}
	return res
}

func (f *fixture) reopen(t testing.TB) {
	t.Helper()
	f.s.Close()
	s, err := NewStore(f.storeDir)
	must(t, err)
	f.s = s
}

func (f *fixture) m(p string) string { return filepath.Join(f.merged, p) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func putFile(t testing.TB, p, content string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), 0o644))
}

// nodeInfo is what the tree comparison checks for one path.
type nodeInfo struct {
	Type   string
	Mode   os.FileMode
	UID    uint32
	GID    uint32
	Size   int64
	Hash   string
	Target string
	Xattrs string
	Mtime  int64
	Group  string // smallest path sharing the inode, for hard-linked files
}

// walkTree records every entry under root (root excluded) without following symlinks.
func walkTree(t testing.TB, root string) map[string]nodeInfo {
	t.Helper()
	out := map[string]nodeInfo{}
	inodes := map[uint64][]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p) // "." is the root itself: its metadata counts too
		st := fi.Sys().(*syscall.Stat_t)
		n := nodeInfo{Type: fi.Mode().Type().String(), Mode: fi.Mode(), UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Nano(), Xattrs: xattrString(t, p)}
		switch {
		case fi.Mode().IsRegular():
			n.Size, n.Hash = fi.Size(), hashFile(t, p)
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
		case fi.Mode()&os.ModeSymlink != 0:
			n.Target, _ = os.Readlink(p)
		}
		out[rel] = n
		return nil
	})
	must(t, err)
	for _, paths := range inodes {
		sort.Strings(paths)
		for _, p := range paths {
			n := out[p]
			n.Group = paths[0]
			out[p] = n
		}
	}
	return out
}

func hashFile(t testing.TB, p string) string {
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	must(t, err)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func xattrString(t testing.TB, p string) string {
	names, err := listXattrs(p)
	must(t, err)
	var parts []string
	for _, n := range names {
		if !keptXattr(n) {
			continue
		}
		v, err := getXattr(p, n)
		must(t, err)
		parts = append(parts, n+"="+string(v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// diffTrees returns a readable list of differences (empty when equal).
func diffTrees(want, got map[string]nodeInfo, withMtime bool) []string {
	var out []string
	for p, w := range want {
		g, ok := got[p]
		if !withMtime {
			w.Mtime, g.Mtime = 0, 0
		}
		switch {
		case !ok:
			out = append(out, "missing "+p)
		case w != g:
			out = append(out, fmt.Sprintf("differs %s: want %+v got %+v", p, w, g))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			out = append(out, "extra "+p)
		}
	}
	sort.Strings(out)
	return out
}

func assertTree(t testing.TB, want, got map[string]nodeInfo, withMtime bool) {
	t.Helper()
	if d := diffTrees(want, got, withMtime); len(d) > 0 {
		if len(d) > 30 {
			d = append(d[:30], fmt.Sprintf("... and %d more", len(d)-30))
		}
		t.Fatalf("tree differs:\n%s", strings.Join(d, "\n"))
	}
}

// standardLower fills a small image: files, nested dirs, a symlink.
func standardLower(dir string) {
	files := map[string]string{
		"etc/hosts": "127.0.0.1 localhost\n", "etc/conf/app.ini": "[a]\nb=1\n",
		"bin/tool": "#!/bin/sh\necho hi\n", "data/a.txt": "alpha", "data/b.txt": "bravo",
		"data/sub/c.txt": "charlie", "keep/k.txt": "keep",
	}
	for p, c := range files {
		_ = os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		_ = os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644)
	}
	_ = os.Chmod(filepath.Join(dir, "bin/tool"), 0o755)
	_ = os.Symlink("hosts", filepath.Join(dir, "etc/hosts.link"))
}
