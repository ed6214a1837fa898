package orchestrator

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/internal/tmpfs"
)

// Restores stage in memory while what they reserved fits the tmpfs, on disk beyond it, and
// get their room back when they end; close unmounts the tmpfs.
func TestRestoreAreaReservesTheTmpfs(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	mem, disk := filepath.Join(root, restoreMemDir), filepath.Join(root, restoreDiskDir)
	t.Cleanup(func() { _ = unix.Unmount(mem, unix.MNT_DETACH) })
	a := &restoreArea{root: root, limit: 1 << 20}

	if base, _ := a.stage(ctx, 2<<20); base != disk {
		t.Fatalf("a restore larger than the tmpfs stages in %s, want %s", base, disk)
	}
	base, release1 := a.stage(ctx, 600<<10)
	if base != mem {
		t.Fatalf("first restore stages in %s, want %s", base, mem)
	}
	if m, err := tmpfs.Mounted(mem); err != nil || !m {
		t.Fatalf("no tmpfs on %s after a restore staged there: %v %v", mem, m, err)
	}
	if base, _ := a.stage(ctx, 600<<10); base != disk {
		t.Fatalf("a second restore beside the first (1.2 MiB of 1 MiB) stages in %s, want %s", base, disk)
	}
	release1()
	release1() // once only
	base, release2 := a.stage(ctx, 600<<10)
	if base != mem {
		t.Fatalf("after the first ended a restore stages in %s, want %s", base, mem)
	}
	release2()

	// Something left on the tmpfs (outside any reservation) sends a restore that would not
	// fit beside it to disk instead of failing on a full tmpfs.
	if err := os.WriteFile(filepath.Join(mem, "leftover"), make([]byte, 700<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if base, _ := a.stage(ctx, 600<<10); base != disk {
		t.Fatalf("beside 700 KiB of leftovers a 600 KiB restore stages in %s, want %s", base, disk)
	}
	if err := a.close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mem); !os.IsNotExist(err) {
		t.Fatalf("after close %s: %v, want it unmounted and removed", mem, err)
	}
}

// Where the tmpfs cannot be mounted (something else is mounted there, or staging in memory
// is off) restores stage on disk.
func TestRestoreAreaFallsBackToDisk(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	disk := filepath.Join(root, restoreDiskDir)
	if base, _ := (&restoreArea{root: root, limit: -1}).stage(ctx, 1); base != disk {
		t.Fatalf("restore_memory off: stages in %s, want %s", base, disk)
	}
	mem := filepath.Join(root, restoreMemDir)
	if err := os.Mkdir(mem, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("ramfs", mem, "ramfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mem, unix.MNT_DETACH) })
	a := &restoreArea{root: root, limit: 1 << 20}
	if base, _ := a.stage(ctx, 1); base != disk {
		t.Fatalf("a ramfs on %s: stages in %s, want %s", mem, base, disk)
	}
	if a.broken == nil {
		t.Fatal("the refused mount is not remembered")
	}
	if err := a.close(); err != nil {
		t.Fatalf("close with no tmpfs of its own: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mem, &st); err != nil || st.Type != unix.RAMFS_MAGIC {
		t.Fatalf("close touched the ramfs it did not mount: %+v %v", st, err)
	}
}
