package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// diskWriter writes 1 MiB files of known content into a directory until a write fails,
// fsyncing every fourth, and says how many it wrote completely (write and close succeeded:
// what the sandbox was told was written) and which error stopped it. The first three are
// only buffered when the fourth is synced.
const diskWriter = `import os, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
n, err = 0, None
try:
    while True:
        with open(os.path.join(d, "f%d" % n), "wb") as f:
            f.write((b"%08d" % n) * (1 << 17))
            if n % 4 == 3:
                f.flush()
                os.fsync(f.fileno())
        n += 1
except OSError as e:
    err = e
os.sync()
print(n, err.errno if err else 0, err.strerror if err else "")
`

// diskChecker reads the first n files back, past the page cache (POSIX_FADV_DONTNEED drops
// their clean pages, so the data comes from the disk), and lists those that differ.
const diskChecker = `import os, sys
d, n = sys.argv[1], int(sys.argv[2])
bad = []
for i in range(n):
    fd = os.open(os.path.join(d, "f%d" % i), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    data = b""
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        data += b
    os.close(fd)
    if data != (b"%08d" % i) * (1 << 17):
        bad.append(i)
print("bad", bad)
`

// TestFaultsDiskFullStateRoot: the sandbox disks ([sandbox] disk) live on the state root, and
// a full state root must not lose what a sandbox was told it wrote. The disk is reserved when
// the sandbox is made, so with the state root full the sandbox still writes (and syncs) up to
// its own limit, where it gets ENOSPC at write(2), and every file it wrote reads back the
// same from the disk after the daemon was killed and restarted. A new sandbox does not fit
// and is refused with resource_exhausted naming the state root, and a checkpoint fails the
// same way; once space is freed both work. With sparse images the sandbox's writes were
// accepted into the page cache and lost at writeback (fsync failed with EIO at once).
func TestFaultsDiskFullStateRoot(t *testing.T) {
	const diskMiB = 48
	d := startDaemonOnTmpfs(t, 256<<20, fmt.Sprintf("[sandbox]\ndisk = \"%dm\"\n", diskMiB))
	d.createPool("p", pythonImage, 1, "--max", "10")
	id := d.lease("p").ID
	d.waitReady("p", 1, time.Minute) // the refill is made before the disk fills
	d.cli("checkpoint", "create", id)

	free := fill(t, d.root)
	t.Cleanup(free)
	out := strings.Fields(d.cli("exec", id, "--timeout", "2m", "--", "python3", "-c", diskWriter, "/root/w"))
	if len(out) < 2 {
		t.Fatalf("disk writer printed %q", out)
	}
	written, _ := strconv.Atoi(out[0])
	ctx := context.Background()
	_, err := d.client().Checkpoint(ctx, id, api.CheckpointRequest{})
	failsFull(t, "checkpoint", err)

	d.kill()
	d.start()
	if got := d.cli("exec", id, "--timeout", "2m", "--", "python3", "-c", diskChecker, "/root/w", strconv.Itoa(written)); got != "bad []\n" {
		t.Fatalf("after a full state root and a daemon restart, of the %d files the sandbox wrote these differ on its disk: %s", written, got)
	}
	if errno := out[1]; errno != "28" || written < diskMiB-8 {
		t.Fatalf("with the state root full the sandbox wrote %d MiB of its %d MiB disk, then got %v; want ENOSPC (28) only at its own limit",
			written, diskMiB, out[1:])
	}

	// With some room left, but less than a disk: the warm sandbox (made before) is leased, the
	// next one does not fit.
	free()
	leave(t, d.root, 16<<20)
	d.lease("p")
	_, err = d.client().Lease(ctx, "p", api.LeaseRequest{})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "reserve the sandbox disk") ||
		!strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("lease of a sandbox whose disk does not fit on the state root: %v; want resource_exhausted naming the disk reservation", err)
	}

	free()
	d.cli("checkpoint", "create", id)
	d.lease("p")
}

// leave takes all but n bytes of dir's filesystem (a file that free removes).
func leave(t *testing.T, dir string, n int64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(st.Bavail)*st.Bsize-n); err != nil {
		t.Fatal(err)
	}
}
