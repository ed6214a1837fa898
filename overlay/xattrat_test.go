package overlay

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestXattrsAt reads xattrs by directory fd and name (listxattrat/getxattrat) and, with the
// calls taken as missing, through /proc/self/fd paths: the same values either way, a value
// longer than the first buffer included, the opaque flag read, and a symlink's own xattrs,
// not its target's.
func TestXattrsAt(t *testing.T) {
	dir := t.TempDir()
	long := bytes.Repeat([]byte("v"), 1000) // past getXattrBy's first 128-byte buffer
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
	must(t, unix.Lsetxattr(filepath.Join(dir, "f"), "user.long", long, 0))
	must(t, unix.Lsetxattr(filepath.Join(dir, "f"), "trusted.short", []byte("s"), 0))
	must(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	must(t, unix.Lsetxattr(filepath.Join(dir, "d"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, os.Symlink("f", filepath.Join(dir, "l")))
	must(t, unix.Lsetxattr(filepath.Join(dir, "l"), "trusted.link", []byte("own"), 0))
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(dfd)

	check := func(t *testing.T) {
		x, opaque, err := readXattrsAt(dfd, "f")
		if err != nil || opaque || len(x) != 2 || !bytes.Equal(x["user.long"], long) || string(x["trusted.short"]) != "s" {
			t.Fatalf("f: %v opaque=%v err=%v", x, opaque, err)
		}
		x, opaque, err = readXattrsAt(dfd, "d")
		if err != nil || !opaque || len(x) != 0 {
			t.Fatalf("d: %v opaque=%v err=%v, want only the opaque flag", x, opaque, err)
		}
		x, _, err = readXattrsAt(dfd, "l")
		if err != nil || len(x) != 1 || string(x["trusted.link"]) != "own" {
			t.Fatalf("symlink l: %v err=%v, want its own xattr only (not followed to f)", x, err)
		}
		x, _, err = readXattrsAt(dfd, ".")
		if err != nil || len(x) != 0 {
			t.Fatalf("the directory itself: %v err=%v", x, err)
		}
		if v, err := getXattrAt(dfd, "d", "trusted.overlay.opaque"); err != nil || string(v) != "y" {
			t.Fatalf("getXattrAt d: %q %v", v, err)
		}
		if _, err := getXattrAt(dfd, "f", "user.none"); err != unix.ENODATA {
			t.Fatalf("getXattrAt of a missing xattr: %v, want ENODATA", err)
		}
		if _, _, err := readXattrsAt(dfd, "gone"); err == nil {
			t.Fatal("xattrs of a missing file: no error")
		}
	}
	t.Run("at", func(t *testing.T) {
		if _, err := listxattrat(dfd, "f", nil); err == unix.ENOSYS {
			testutil.SkipOrFail(t, "kernel without listxattrat (before 6.13); the proc case covers the fallback")
		}
		check(t)
		if noXattrAt.Load() {
			t.Fatal("listxattrat taken as missing")
		}
	})
	t.Run("proc", func(t *testing.T) {
		noXattrAt.Store(true)
		defer noXattrAt.Store(false)
		check(t)
	})
}
