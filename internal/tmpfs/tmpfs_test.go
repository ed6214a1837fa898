package tmpfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

func TestEnsureMountsReusesAndUnmounts(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := filepath.Join(t.TempDir(), "mem")
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if m, err := Mounted(filepath.Dir(dir)); err != nil || m {
		t.Fatalf("a plain directory: mounted %v, %v", m, err)
	}
	if err := Ensure(dir, 1<<20, unix.MS_NOEXEC, true); err != nil {
		t.Fatal(err)
	}
	_, thpErr := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	if opts := mountOptions(t, dir); thpErr == nil && !strings.Contains(opts, "huge=within_size") {
		t.Errorf("mount options %q: want huge=within_size (the kernel has huge pages for tmpfs)", opts)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC || int64(st.Blocks)*st.Bsize != 1<<20 {
		t.Fatalf("statfs %s: %+v %v, want a 1 MiB tmpfs", dir, st, err)
	}
	if st.Flags&(unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOEXEC) != unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOEXEC {
		t.Errorf("mount flags %#x: want nosuid, nodev and noexec", st.Flags)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A second Ensure (a restarted daemon) keeps the mount and what is in it.
	if err := Ensure(dir, 1<<20, unix.MS_NOEXEC, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "f")); err != nil {
		t.Fatalf("a second Ensure mounted over the first: %v", err)
	}
	if free, err := Free(dir); err != nil || free <= 0 || free > 1<<20 {
		t.Errorf("free %d, %v: want within the 1 MiB", free, err)
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if m, err := Mounted(dir); err != nil || m {
		t.Fatalf("after Unmount: mounted %v, %v", m, err)
	}
	if err := Unmount(dir); err != nil {
		t.Errorf("Unmount of a plain directory: %v", err)
	}
	if err := Unmount(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("Unmount of a missing directory: %v", err)
	}
}

// A symlink, a file or a mount of another file system where the tmpfs goes is refused,
// never followed or mounted over.
func TestEnsureRefusesWhatIsNotItsOwn(t *testing.T) {
	testutil.RequiresRoot(t)
	base := t.TempDir()
	target := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(base, "ramfs")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("ramfs", other, "ramfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(other, unix.MNT_DETACH) })
	for _, dir := range []string{link, file, other} {
		if err := Ensure(dir, 1<<20, 0, false); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("Ensure(%s): %v, want failed_precondition", dir, err)
		}
	}
	if m, err := Mounted(target); err != nil || m {
		t.Errorf("the symlink's target got a mount: %v %v", m, err)
	}
	if err := Ensure(filepath.Join(base, "zero"), 0, 0, false); !errdefs.IsInvalidArgument(err) {
		t.Errorf("size 0: %v, want invalid_argument", err)
	}
}

// mountOptions returns the super block options of the mount on dir (from mountinfo).
func mountOptions(t *testing.T, dir string) string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir))
	if err != nil || len(ms) != 1 {
		t.Fatalf("mountinfo of %s: %v %v", dir, ms, err)
	}
	return ms[0].VFSOptions
}
