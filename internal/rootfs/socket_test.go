package rootfs

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
)

// TestChmodSocketNeverFollowsASwappedSymlink: a sandbox renames a symlink to a host file
// over its run directory's socket while the host binds and chmods it; the host file's mode
// never changes.
func TestChmodSocketNeverFollowsASwappedSymlink(t *testing.T) {
	host := filepath.Join(t.TempDir(), "shadow")
	write(t, host, "secret")
	os.Chmod(host, 0o600)
	run := t.TempDir()
	sock := filepath.Join(run, "api.sock")
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tmp := filepath.Join(run, "link")
		for !stop.Load() {
			_ = os.Symlink(host, tmp)
			_ = os.Rename(tmp, sock)
		}
	}()
	refused := 0
	for range 1000 {
		_ = os.Remove(sock)
		l, err := net.Listen("unix", sock)
		if err != nil {
			continue
		}
		if err := ChmodSocket(sock, 0o666); errdefs.IsFailedPrecondition(err) {
			refused++
		}
		l.Close()
	}
	stop.Store(true)
	wg.Wait()
	st, err := os.Stat(host)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("host file mode %v (%v), want 0600", st.Mode(), err)
	}
	t.Logf("%d swaps refused", refused)
}
