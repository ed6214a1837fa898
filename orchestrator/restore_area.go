package orchestrator

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/tmpfs"
)

// Where a restore stages the blobs it downloads (the unpacked CRIU images, the rootfs diff,
// the state document): in memory, on a tmpfs of [snapshots] restore_memory bytes mounted at
// <root>/restore-mem on the first restore, when the snapshot fits what the restores under
// way left of it; otherwise on disk, under <root>/restore. The download is the restore's
// critical path (docs/snapshot-format.md), and its writes are what a tmpfs saves: the 50 MiB
// of a benchmark snapshot's images download and unpack in 69-76 ms there against 108-110 on
// ext4 (docs/benchmarks.md, Session 14). The tmpfs has huge pages on (criu.Unpack writes in
// 1 MiB writes to fill them): from its 4 KiB pages CRIU's read of the images was slower
// than from ext4's page cache. The staging is removed when the restore ends either way
// (download.close), so the tmpfs holds only restores under way.

const (
	restoreDiskDir = "restore"
	restoreMemDir  = "restore-mem"
)

// restoreArea hands out the base directory of each restore's staging, reserving the
// snapshot's size on the tmpfs until the restore releases it.
type restoreArea struct {
	root  string // the daemon's root
	limit int64  // the tmpfs's size; <= 0: none (disk only)

	mu       sync.Mutex
	mounted  bool  // the tmpfs is on root/restoreMemDir
	broken   error // why it cannot be mounted (disk from then on)
	reserved int64 // bytes the restores under way reserved on it
}

// stage returns the base directory for a restore staging need bytes, and the function that
// gives its reservation back (after the staging is removed).
func (a *restoreArea) stage(ctx context.Context, need int64) (base string, release func()) {
	disk := filepath.Join(a.root, restoreDiskDir)
	if a.limit <= 0 || need > a.limit {
		return disk, func() {}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	mem := filepath.Join(a.root, restoreMemDir)
	if !a.mounted && a.broken == nil {
		if a.broken = tmpfs.Ensure(mem, a.limit, unix.MS_NOEXEC, true); a.broken != nil {
			log.L(ctx).Warn("in-memory restore staging unavailable: restores stage on disk", "dir", mem, "error", a.broken)
		}
		a.mounted = a.broken == nil
	}
	if !a.mounted || a.reserved+need > a.limit {
		return disk, func() {}
	}
	// Counted as if the restores under way had written nothing of theirs yet: free space
	// below that means something else fills the tmpfs (a leftover the sweep could not
	// remove), and the restore goes to disk rather than fail on a full tmpfs.
	if free, err := tmpfs.Free(mem); err != nil || free < need+a.reserved {
		return disk, func() {}
	}
	a.reserved += need
	var once sync.Once
	return mem, func() {
		once.Do(func() {
			a.mu.Lock()
			a.reserved -= need
			a.mu.Unlock()
		})
	}
}

// close unmounts the tmpfs (no restore runs once the daemon closes).
func (a *restoreArea) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.mounted {
		return nil
	}
	a.mounted = false
	mem := filepath.Join(a.root, restoreMemDir)
	if err := tmpfs.Unmount(mem); err != nil {
		return err
	}
	return os.Remove(mem)
}
