package rootfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestOpsNeverFollowSymlinks: every single-file op refuses a path through a symlink the tree's
// owner made, and a symlink at the final component is replaced or removed, never followed.
func TestOpsNeverFollowSymlinks(t *testing.T) {
	dir, r := mkRoot(t)
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "host")
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "filelink")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadDir("link"); err == nil {
		t.Error("ReadDir followed a symlink")
	}
	if _, err := r.MkdirAll("link/sub", 0o755); err == nil {
		t.Error("MkdirAll went through a symlink")
	}
	if _, err := r.WriteFile("link/planted", strings.NewReader("x"), 0o644); err == nil {
		t.Error("WriteFile went through a symlink")
	}
	if _, _, err := r.OpenFile("filelink"); err == nil {
		t.Error("OpenFile opened a symlink")
	}
	if err := r.Rename("link/secret", "stolen"); err == nil {
		t.Error("Rename took a file through a symlink")
	}
	if _, err := r.WriteFile("filelink", strings.NewReader("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.RemoveAll("link"); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(data) != "host" {
		t.Errorf("the symlinks' target changed: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Error("a file was planted outside the root")
	}
}

func TestOpsRoundTrip(t *testing.T) {
	dir, r := mkRoot(t)
	if made, err := r.MkdirAll("a/b", 0o755); err != nil || !made {
		t.Fatalf("MkdirAll: %v %v", made, err)
	}
	if made, err := r.MkdirAll("a/b", 0o755); err != nil || made {
		t.Fatalf("MkdirAll again: %v %v", made, err)
	}
	if n, err := r.WriteFile("a/b/c/f.txt", strings.NewReader("hello"), 0o600); err != nil || n != 5 {
		t.Fatalf("WriteFile: %d %v", n, err)
	}
	f, st, err := r.OpenFile("a/b/c/f.txt")
	if err != nil || st.Size != 5 {
		t.Fatalf("OpenFile: %v %d", err, st.Size)
	}
	f.Close()
	if err := r.Rename("a/b/c/f.txt", "x/y.txt"); err != nil {
		t.Fatal(err)
	}
	ents, err := r.ReadDir("x")
	if err != nil || len(ents) != 1 || ents[0].Name != "y.txt" {
		t.Fatalf("ReadDir: %v %v", ents, err)
	}
	if err := r.RemoveAll("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
		t.Errorf("a survived RemoveAll: %v", err)
	}
	if err := r.RemoveAll(""); err == nil {
		t.Error("RemoveAll of the root was accepted")
	}
}

// TestOpsOwnNewEntriesBySandboxRoot: with a user namespace mapping, what the ops make belongs
// to the sandbox's root (host root is nobody inside), and owners read back as sandbox ids.
func TestOpsOwnNewEntriesBySandboxRoot(t *testing.T) {
	testutil.RequiresRoot(t) // chown to another uid needs root
	dir := t.TempDir()
	r, err := Open(dir, WithIDMap(IDMap{HostID: 200000, Size: 65536}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.WriteFile("d/f", strings.NewReader("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/f"} {
		st, err := r.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Uid != 200000 || st.Gid != 200000 || r.SandboxID(st.Uid) != 0 {
			t.Errorf("%s owned by %d:%d (sandbox %d), want host 200000 = sandbox root", p, st.Uid, st.Gid, r.SandboxID(st.Uid))
		}
	}
}
