//go:build linux

package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// fifoOpened makes a FIFO at p and reports, through the returned flag, whether anything ever
// opened it for reading: a writer blocks in open(O_WRONLY) until a reader comes. The writer
// opens a hard link in holdDir (another directory on the same filesystem), so swaps of p do not change what it opens. stop
// unblocks that writer (by opening the FIFO itself) and waits for it.
func fifoOpened(t *testing.T, holdDir, p string) (opened *atomic.Bool, stop func()) {
	t.Helper()
	stable := filepath.Join(holdDir, "fifo")
	must(t, unix.Mkfifo(stable, 0o644))
	must(t, os.Link(stable, p))
	opened = new(atomic.Bool)
	stopping := new(atomic.Bool)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fd, err := unix.Open(stable, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		if !stopping.Load() {
			opened.Store(true)
		}
	}()
	time.Sleep(100 * time.Millisecond) // let the writer block in open
	stop = func() {
		stopping.Store(true)
		for {
			select {
			case <-done:
				return
			default:
			}
			if fd, err := unix.Open(stable, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
				time.Sleep(time.Millisecond)
				unix.Close(fd)
			}
		}
	}
	return opened, stop
}

func statID(t *testing.T, p string) fileID {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return fileID{mode: st.Mode, dev: st.Dev, ino: st.Ino}
}

// A regular file the walk stat'ed, then swapped for a FIFO or a device node (renameat2
// RENAME_EXCHANGE, as a sandbox process can): openExpected refuses it without opening it.
func TestOpenExpectedNeverOpensASwappedInFIFOOrDevice(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	f, fifo, dev := filepath.Join(dir, "f"), filepath.Join(dir, "fifo"), filepath.Join(dir, "dev")
	must(t, os.WriteFile(f, []byte("data"), 0o644))
	id := statID(t, f)
	dirfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(dirfd)

	fd, err := openExpected(dirfd, "f", id)
	must(t, err)
	unix.Close(fd)

	opened, stop := fifoOpened(t, t.TempDir(), fifo)
	must(t, unix.Renameat2(unix.AT_FDCWD, f, unix.AT_FDCWD, fifo, unix.RENAME_EXCHANGE))
	if _, err := openExpected(dirfd, "f", id); !errors.Is(err, errReplaced) {
		t.Fatalf("FIFO swapped in: got %v, want errReplaced", err)
	}
	time.Sleep(50 * time.Millisecond)
	stop()
	if opened.Load() {
		t.Fatal("openExpected opened the FIFO swapped in for reading")
	}

	must(t, unix.Renameat2(unix.AT_FDCWD, f, unix.AT_FDCWD, fifo, unix.RENAME_EXCHANGE)) // f is the file again
	must(t, unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 11))))                 // /dev/kmsg
	must(t, unix.Renameat2(unix.AT_FDCWD, f, unix.AT_FDCWD, dev, unix.RENAME_EXCHANGE))
	if _, err := openExpected(dirfd, "f", id); !errors.Is(err, errReplaced) {
		t.Fatalf("device swapped in: got %v, want errReplaced", err)
	}
	// A symlink to the file itself is not followed either.
	must(t, os.Remove(f))
	must(t, os.Symlink(dev, f))
	if _, err := openExpected(dirfd, "f", id); !errors.Is(err, errReplaced) {
		t.Fatalf("symlink swapped in: got %v, want errReplaced", err)
	}
}

// Verify runs while a host-side loop swaps a checkpointed regular file with a FIFO over and
// over: every verify finishes, and the FIFO is never opened (a writer blocked on it would
// wake up).
func TestVerifyNeverOpensAFIFOSwappedInDuringTheWalk(t *testing.T) {
	f := newFixture(t, standardLower)
	for i := range 20 {
		must(t, os.WriteFile(f.m("d"+string(rune('a'+i))), []byte("content"), 0o644))
	}
	must(t, os.WriteFile(f.m("f"), []byte("content"), 0o644))
	f.capture(t, "c0", L1)
	must(t, os.Mkdir(f.m("hold"), 0o755))
	opened, stop := fifoOpened(t, f.m("hold"), f.m("fifo"))
	var swaps atomic.Int64
	quit := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for {
			select {
			case <-quit:
				return
			default:
			}
			if unix.Renameat2(unix.AT_FDCWD, f.m("f"), unix.AT_FDCWD, f.m("fifo"), unix.RENAME_EXCHANGE) == nil {
				swaps.Add(1)
			}
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	runs := 0
	for time.Now().Before(deadline) && !opened.Load() {
		start := time.Now()
		if _, err := f.s.Verify(t.Context(), "c0", f.merged); err != nil {
			t.Fatalf("verify during swaps: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("verify took %v", d)
		}
		runs++
	}
	close(quit)
	<-swapped
	stop()
	if opened.Load() {
		t.Fatalf("verify opened the FIFO swapped in for a regular file (after %d runs, %d swaps)", runs, swaps.Load())
	}
	t.Logf("%d verifies, %d swaps", runs, swaps.Load())
}
