package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// swapper exchanges two names with renameat2(RENAME_EXCHANGE) until stopped, as a hostile
// sandbox does while the host copies one of them.
func swapper(t *testing.T, dir, a, b string) (stop func() int64) {
	t.Helper()
	var done atomic.Bool
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !done.Load() {
			if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(dir, a), unix.AT_FDCWD, filepath.Join(dir, b), unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("exchange: %v", err)
				return
			}
			swaps.Add(1)
		}
	}()
	return func() int64 { done.Store(true); wg.Wait(); return swaps.Load() }
}

// archiveRace copies dir/f while f is swapped with the special file dir/x, and checks that
// every copy either archived the regular file (its content) or failed naming the swap.
func archiveRace(t *testing.T, dir string, r *Root) {
	t.Helper()
	stop := swapper(t, dir, "f", "x")
	copied, refused := 0, 0
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; (refused < 3 || copied < 3) && time.Now().Before(deadline); i++ {
		var buf bytes.Buffer
		err := r.Archive("f", &buf)
		if err != nil {
			if !errdefs.IsFailedPrecondition(err) && !errdefs.IsNotFound(err) {
				stop()
				t.Fatalf("copy %d: want a refused swap, got %v", i, err)
			}
			refused++
			continue
		}
		tr := tar.NewReader(&buf)
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) { // the walk saw the special file and skipped it
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if hdr.Typeflag != tar.TypeReg || string(body) != "data" {
			stop()
			t.Fatalf("copy %d read something else than the regular file: %q type %c", i, body, hdr.Typeflag)
		}
		copied++
	}
	swaps := stop()
	t.Logf("%d swaps, %d copies of the file, %d refused", swaps, copied, refused)
	if refused == 0 {
		t.Errorf("no copy ever raced with a swap; the test proves nothing")
	}
}

func TestArchiveRefusesFIFOSwappedIn(t *testing.T) {
	dir, r := mkRoot(t)
	write(t, filepath.Join(dir, "f"), "data")
	if err := unix.Mkfifo(filepath.Join(dir, "x"), 0o644); err != nil {
		t.Fatal(err)
	}
	archiveRace(t, dir, r)
}

func TestArchiveRefusesDeviceSwappedIn(t *testing.T) {
	testutil.RequiresRoot(t)
	dir, r := mkRoot(t)
	write(t, filepath.Join(dir, "f"), "data")
	// /dev/zero: a copy that reads it returns zeros where the file's bytes should be.
	if err := unix.Mknod(filepath.Join(dir, "x"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	archiveRace(t, dir, r)
}

func TestCopyRefusesPseudoFilesystems(t *testing.T) {
	r, err := Open("/")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, p := range []string{"proc/self/status", "sys/kernel"} {
		if err := r.Archive(p, io.Discard); !errdefs.IsInvalidArgument(err) {
			t.Errorf("archive /%s: want invalid argument (kernel interface), got %v", p, err)
		}
	}
	_, err = r.Extract("/proc/self", tarOf(t, "f", "x"), ExtractOptions{})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("extract into /proc: want invalid argument, got %v", err)
	}
}
