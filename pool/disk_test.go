package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// fitrim is FITRIM, _IOWR('X', 121, struct fstrim_range): what fstrim(8) asks.
const fitrim = 0xc0185879

// allocated returns the bytes of path the filesystem holds blocks for.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// mountDisk makes a disk image of size in <dir>/containers/c1 and mounts it at <dir>/mnt the
// way attachDisk does; it returns the image and mount point.
func mountDisk(t *testing.T, dir string, size int64) (img, mnt string) {
	t.Helper()
	testutil.RequiresBinary(t, "mkfs.ext4")
	img = filepath.Join(dir, "containers", "c1", diskImage)
	mnt = filepath.Join(dir, "mnt")
	for _, d := range []string{filepath.Dir(img), mnt} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := makeImage(context.Background(), img, size); err != nil {
		t.Fatal(err)
	}
	dev, err := attachLoop(img)
	if err != nil {
		testutil.SkipOrFail(t, "no loop device: %v", err)
	}
	defer dev.Close()
	if err := unix.Mount(dev.Name(), mnt, "ext4", 0, "noinit_itable,nodiscard"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	return img, mnt
}

// TestDiskImageIsReserved: a sandbox disk holds all its blocks on the state root from the
// start, and nothing hands them back: the loop device refuses discards (fstrim, FITRIM), and
// ReserveDisks (run at start) gives a hole punched anyway its blocks again. A sparse image
// would let a full state root fail the writeback of writes the sandbox was told succeeded.
func TestDiskImageIsReserved(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	const size = 64 << 20
	img, mnt := mountDisk(t, dir, size)
	if got := allocated(t, img); got < size {
		t.Fatalf("image holds %d of its %d bytes: not reserved", got, size)
	}
	if err := os.WriteFile(filepath.Join(mnt, "f"), make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	if err := os.Remove(filepath.Join(mnt, "f")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	f, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	rng := struct{ start, len, minLen uint64 }{0, ^uint64(0), 0} // struct fstrim_range
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fitrim, uintptr(unsafe.Pointer(&rng)))
	f.Close()
	if !errors.Is(errno, unix.EOPNOTSUPP) {
		t.Fatalf("FITRIM on a sandbox disk: %v (trimmed %d bytes), want EOPNOTSUPP", errno, rng.len)
	}
	if got := allocated(t, img); got < size {
		t.Fatalf("after fstrim the image holds %d of its %d bytes", got, size)
	}
	// A hole punched behind the loop device's back (the last MiB: free in a fresh ext4).
	g, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(g.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, size-(1<<20), 1<<20)
	g.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, img); got >= size {
		t.Fatalf("punching a hole left %d bytes allocated", got)
	}
	if err := ReserveDisks(filepath.Join(dir, "containers")); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, img); got < size {
		t.Fatalf("after ReserveDisks the image holds %d of its %d bytes", got, size)
	}
}

// TestDiskImageOnAFullStateRoot: a disk that does not fit on the state root is refused when
// the sandbox is made, at once (before it is formatted), with resource_exhausted naming the
// reservation and the sizes (create's cleanup then removes the sandbox's directory with the
// image).
func TestDiskImageOnAFullStateRoot(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "mkfs.ext4")
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := os.Mkdir(filepath.Join(dir, "c1"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := &runtime{dir: dir}
	d, err := r.reserveDisk(context.Background(), "c1", 32<<20)
	if d != nil || !errdefs.IsResourceExhausted(err) || !errors.Is(err, unix.ENOSPC) ||
		!strings.Contains(err.Error(), "reserve the sandbox disk (32MiB) on the state root") {
		t.Fatalf("a 32 MiB disk on a 24 MiB state root: %v; want resource_exhausted naming the sizes", err)
	}
	t.Log(err)
}

// BenchmarkDiskImage measures making a sandbox disk image as a sandbox creation does
// (reserved: fallocate of the whole image, then mkfs) against the sparse image made before
// (mkfs only), and removing it (destroy), on the filesystem of $TMPDIR.
func BenchmarkDiskImage(b *testing.B) {
	testutil.RequiresBinary(b, "mkfs.ext4")
	for _, size := range []int64{1 << 30, 2 << 30, 10 << 30} {
		for _, mode := range []string{"sparse", "reserved"} {
			b.Run(fmt.Sprintf("%s-%dGiB", mode, size>>30), func(b *testing.B) {
				dir := b.TempDir()
				var remove time.Duration
				for i := 0; i < b.N; i++ {
					img := filepath.Join(dir, diskImage)
					if mode == "reserved" {
						if err := makeImage(context.Background(), img, size); err != nil {
							b.Fatal(err)
						}
					} else if err := sparseImage(img, size); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					start := time.Now()
					if err := os.Remove(img); err != nil {
						b.Fatal(err)
					}
					remove += time.Since(start)
					b.StartTimer()
				}
				b.ReportMetric(float64(remove.Microseconds())/1000/float64(b.N), "remove-ms/op")
			})
		}
	}
}

// sparseImage makes the image the way disks were made before they were reserved.
func sparseImage(path string, size int64) error {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(path, size); err != nil {
		return err
	}
	return exec.Command("mkfs.ext4", append(mkfsArgs, path)...).Run()
}
