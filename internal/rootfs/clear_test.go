package rootfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestClearNeverFollows: Clear empties a directory, nested ones included, keeps what keep
// spares and never touches what a symlink inside points at.
func TestClearNeverFollows(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	canary := filepath.Join(outside, "canary")
	must(t, os.WriteFile(canary, []byte("host"), 0o644))
	dir := filepath.Join(root, "run")
	must(t, os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "a", "b", "secret"), []byte("x"), 0o600))
	must(t, os.Symlink(outside, filepath.Join(dir, "link")))
	must(t, os.Symlink(outside, filepath.Join(dir, "a", "link")))
	must(t, os.WriteFile(filepath.Join(dir, "keep"), nil, 0o600))
	r, err := Open(root)
	must(t, err)
	defer r.Close()
	n, err := r.Clear("run", func(name string, _ *unix.Stat_t, _ bool) bool { return name == "keep" })
	if err != nil || n != 5 {
		t.Fatalf("clear: %d entries, %v; want 5", n, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || left[0].Name() != "keep" {
		t.Fatalf("left %v, want only keep", left)
	}
	if b, err := os.ReadFile(canary); err != nil || string(b) != "host" {
		t.Fatalf("the symlink's target was touched: %q, %v", b, err)
	}
	must(t, os.Symlink(outside, filepath.Join(root, "swapped")))
	if _, err := r.Clear("swapped", nil); err == nil {
		t.Fatal("cleared through a symlink")
	}
	if _, err := r.Clear("run", nil, unix.TMPFS_MAGIC, 0x19800202); err == nil && !onTmpfs(dir) {
		t.Fatal("cleared a directory on another filesystem than asked for")
	}
}

func onTmpfs(dir string) bool {
	var s unix.Statfs_t
	return unix.Statfs(dir, &s) == nil && s.Type == unix.TMPFS_MAGIC
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
