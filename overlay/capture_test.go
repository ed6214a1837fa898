//go:build linux

package overlay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// applyEveryChangeKind makes one change of each kind through the merged mount.
func applyEveryChangeKind(t *testing.T, f *fixture) {
	t.Helper()
	putFile(t, f.m("new/file.txt"), "new content")          // new file + dir
	putFile(t, f.m("data/a.txt"), "alpha modified, longer") // modify lower file
	must(t, os.Remove(f.m("data/b.txt")))                   // delete lower file: whiteout
	must(t, os.Symlink("/etc/passwd", f.m("new/link")))     // symlink
	must(t, os.Link(f.m("new/file.txt"), f.m("new/hard")))  // hard link
	must(t, os.Chmod(f.m("bin/tool"), 0o700))               // mode
	must(t, os.Lchown(f.m("etc/hosts"), 1234, 4321))        // owner
	must(t, unix.Lsetxattr(f.m("data/sub/c.txt"), "user.tag", []byte("v1"), 0))
	must(t, unix.Lsetxattr(f.m("keep/k.txt"), "trusted.note", []byte("t"), 0))
	must(t, os.RemoveAll(f.m("etc/conf")))    // rm -rf of a lower dir
	must(t, os.Mkdir(f.m("etc/conf"), 0o750)) // recreated: opaque dir
	putFile(t, f.m("etc/conf/other.ini"), "x")
	must(t, unix.Mkfifo(f.m("new/fifo"), 0o640))
}

func TestCaptureRecordsEachChangeKind(t *testing.T) {
	f := newFixture(t, standardLower)
	first := f.capture(t, "c0", L1)
	if first.FilesChanged != 0 {
		t.Fatalf("first capture of an empty upper dir changed %d files: %v", first.FilesChanged, first.Paths)
	}
	applyEveryChangeKind(t, f)
	res := f.capture(t, "c1", L1)
	got := map[string]*Entry{}
	for _, e := range f.s.chain[1].Entries {
		got[e.Path] = e
	}
	expect := map[string]Kind{
		"new": KindDir, "new/file.txt": KindFile, "new/hard": KindFile, "new/link": KindSymlink,
		"new/fifo": KindFifo, "data/a.txt": KindFile, "data/b.txt": KindWhiteout, "bin/tool": KindFile,
		"etc/hosts": KindFile, "data/sub/c.txt": KindFile, "keep/k.txt": KindFile, "etc/conf": KindDir,
		"etc/conf/other.ini": KindFile,
	}
	for p, k := range expect {
		if got[p] == nil || got[p].Kind != k {
			t.Errorf("%s: want %s entry, got %+v", p, k, got[p])
		}
	}
	checks := []struct {
		ok   bool
		what string
	}{
		{got["etc/conf"] != nil && got["etc/conf"].Opaque, "etc/conf opaque"},
		{got["new/link"] != nil && got["new/link"].Target == "/etc/passwd", "symlink target"},
		{got["new/hard"] != nil && got["new/hard"].Link != "" && got["new/hard"].Link == got["new/file.txt"].Link, "hard-link group"},
		{got["bin/tool"] != nil && got["bin/tool"].Mode == 0o700, "mode"},
		{got["etc/hosts"] != nil && got["etc/hosts"].UID == 1234 && got["etc/hosts"].GID == 4321, "owner"},
		{got["data/sub/c.txt"] != nil && string(got["data/sub/c.txt"].Xattrs["user.tag"]) == "v1", "user xattr"},
		{got["keep/k.txt"] != nil && string(got["keep/k.txt"].Xattrs["trusted.note"]) == "t", "trusted xattr"},
		{res.BytesCopied >= int64(len("new content")+len("alpha modified, longer")), "bytes copied"},
		{res.FilesChanged == len(res.Paths) && res.FilesChanged >= len(expect), "files changed"},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("capture did not record %s", c.what)
		}
	}
	for _, e := range f.s.chain[1].Entries {
		for k := range e.Xattrs {
			if strings.HasPrefix(k, "trusted.overlay.") {
				t.Errorf("%s: overlay bookkeeping xattr %s recorded", e.Path, k)
			}
		}
	}
	// Nothing changed since: an empty delta.
	if again := f.capture(t, "c2", L1); again.FilesChanged != 0 {
		t.Fatalf("capture without changes recorded %v", again.Paths)
	}
	// Deleting an upper-only file records it as gone.
	must(t, os.Remove(f.m("new/hard")))
	gone := f.capture(t, "c3", L1)
	if !contains(gone.Paths, "new/hard") || !contains(gone.Paths, "new/file.txt") {
		t.Fatalf("unlink of a hard link not captured (both paths expected): %v", gone.Paths)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestCaptureValidation(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	cases := []CaptureRequest{
		{ID: "../x", Parent: "c0", Level: L1, Upper: f.upper},
		{ID: "c0", Parent: "c0", Level: L1, Upper: f.upper},
		{ID: "c1", Parent: "nope", Level: L1, Upper: f.upper},
		{ID: "c1", Parent: "c0", Level: 7, Upper: f.upper},
	}
	for _, c := range cases {
		if _, err := f.s.Capture(t.Context(), c); err == nil {
			t.Errorf("capture %+v: want error", c)
		}
	}
}

func TestReopenAfterCrashKeepsPreviousCheckpoint(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	putFile(t, f.m("data/a.txt"), "one")
	f.capture(t, "c1", L1)
	want := walkTree(t, f.merged)
	// A capture that died before its rename leaves only a temp file.
	must(t, os.WriteFile(filepath.Join(f.storeDir, tempPrefix+"crashed"), []byte("partial"), 0o600))
	f.reopen(t)
	if _, err := os.Stat(filepath.Join(f.storeDir, tempPrefix+"crashed")); !os.IsNotExist(err) {
		t.Fatalf("leftover temp pack not removed: %v", err)
	}
	if got := f.s.Checkpoints(); len(got) != 2 || got[1] != "c1" {
		t.Fatalf("checkpoints after reopen: %v", got)
	}
	putFile(t, f.m("data/b.txt"), "two")
	res := f.capture(t, "c2", L1)
	// data/b.txt is copied up, which also moves its upper parent's mtime.
	if len(res.Paths) != 2 || res.Paths[0] != "data" || res.Paths[1] != "data/b.txt" {
		t.Fatalf("first L1 after reopen should hold only the new change, got %v", res.Paths)
	}
	f.rollback(t, "c1")
	assertTree(t, want, walkTree(t, f.merged), true)
}

// TestPrepareCommitMeta: a prepared capture holds the store until Commit or Abort; an aborted
// one leaves nothing behind, a committed one keeps its record across a reopen.
func TestPrepareCommitMeta(t *testing.T) {
	f := newFixture(t, standardLower)
	f.capture(t, "c0", L1)
	must(t, os.WriteFile(f.m("data/new.txt"), []byte("new"), 0o644))
	req := CaptureRequest{ID: "c1", Parent: "c0", Level: L1, Upper: f.upper, Lower: []string{f.lower}}
	p, err := f.s.Prepare(t.Context(), req)
	must(t, err)
	if n, _ := p.Changed(); n == 0 {
		t.Fatal("prepared capture records nothing")
	}
	p.Abort()
	p.Abort() // a no-op
	if got := f.s.Checkpoints(); len(got) != 1 {
		t.Fatalf("after abort: checkpoints %v, want [c0]", got)
	}
	p, err = f.s.Prepare(t.Context(), req)
	must(t, err)
	if _, err := p.Commit([]byte("not json")); err == nil {
		t.Fatal("commit with a non-JSON record succeeded")
	}
	p, err = f.s.Prepare(t.Context(), req)
	must(t, err)
	res, err := p.Commit([]byte(`{"step":7}`))
	must(t, err)
	if !pathsOf(res)["data/new.txt"] {
		t.Fatalf("c1 lacks data/new.txt: %v", res.Paths)
	}
	if _, err := p.Commit(nil); err == nil {
		t.Fatal("second commit succeeded")
	}
	f.reopen(t)
	meta, err := f.s.Meta("c1")
	must(t, err)
	if string(meta) != `{"step":7}` {
		t.Fatalf("meta after reopen: %s", meta)
	}
}
