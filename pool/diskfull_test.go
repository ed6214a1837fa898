package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/testutil"
)

// tmpfsRoot mounts a tmpfs of size bytes as a state root.
func tmpfsRoot(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// leaveFree takes all but n bytes of dir's filesystem with a file; the returned func removes it.
func leaveFree(t *testing.T, dir string, n int64) func() {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, freeBytes(t, dir)-n); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCreateOnAFullStateRoot: a sandbox creation reserves the sandbox's disk before it writes
// anything else of the sandbox on the state root. A state root with less room than the disk
// refuses the create with resource_exhausted naming the reservation, not with the ENOSPC of
// a small file written first (the CRIU config the orchestrator writes from SpecOpts, here a
// 1 MiB one so that it cannot fit). With room for the disk but not for that file, the create
// is refused with resource_exhausted naming the file. A create that fails after its container
// and disk were made (a restore that finds no room) leaves nothing behind either: no
// directory, container, snapshot or mounted disk, and every byte back on the state root.
func TestCreateOnAFullStateRoot(t *testing.T) {
	testutil.RequiresBinary(t, "mkfs.ext4")
	const disk = 16 << 20
	root := tmpfsRoot(t, 64<<20)
	client, initBin := testEnv(t)
	var specSize atomic.Int64
	var specCalls atomic.Int32
	specSize.Store(4 << 10)
	ctx := context.Background()
	m, err := NewManager(ctx, client, Options{Root: root, InitBinary: initBin, Node: "test-full-" + filepath.Base(filepath.Dir(root)),
		SpecOpts: func(cid, dir string) ([]oci.SpecOpts, error) {
			specCalls.Add(1)
			return nil, atomicfile.WriteFile(filepath.Join(dir, "criu.conf"), make([]byte, specSize.Load()), 0o644)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer removeAll(t, m)
	if _, err := m.CreatePool(ctx, Template{Name: "full", Image: busybox, DiskBytes: disk, Max: 4}); err != nil {
		t.Fatal(err)
	}
	containers := filepath.Join(root, "containers")
	leftNothing := func(what string, free int64, cid string) {
		t.Helper()
		if ents, err := os.ReadDir(containers); err != nil || len(ents) != 0 {
			t.Errorf("%s: the state root's containers dir holds %v (%v), want nothing", what, ents, err)
		}
		if disks, err := mountedDisks(containers); err != nil || len(disks) != 0 {
			t.Errorf("%s: mounted sandbox disks %v (%v), want none", what, disks, err)
		}
		if got := freeBytes(t, root); got != free {
			t.Errorf("%s: %d bytes free on the state root after the failed create, %d before", what, got, free)
		}
		if cid == "" {
			return
		}
		if _, err := client.LoadContainer(ctx, cid); !errdefs.IsNotFound(err) {
			t.Errorf("%s: container %s: %v, want not found", what, cid, err)
		}
		if _, err := client.SnapshotService(m.opts.Snapshotter).Stat(ctx, cid); !errdefs.IsNotFound(err) {
			t.Errorf("%s: snapshot %s: %v, want not found", what, cid, err)
		}
	}

	// The setup makes sandboxes when there is room.
	res, err := m.Lease(ctx, "full", LeaseRequest{})
	if err != nil || !res.Cold {
		t.Fatalf("cold lease with room on the state root: %v (cold %v)", err, res.Cold)
	}
	if err := m.Release(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, 10*time.Millisecond, "the released sandbox destroyed", func() bool {
		ents, _ := os.ReadDir(containers)
		return len(ents) == 0
	})

	// Less room than the disk (and than the CRIU config).
	specSize.Store(1 << 20)
	release := leaveFree(t, root, 64<<10)
	free, calls := freeBytes(t, root), specCalls.Load()
	_, err = m.Lease(ctx, "full", LeaseRequest{})
	if !errdefs.IsResourceExhausted(err) || !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "reserve the sandbox disk (16MiB) on the state root") {
		t.Fatalf("cold lease with 64 KiB free for a 16 MiB disk: %v; want resource_exhausted naming the disk reservation (wrapping ENOSPC)", err)
	}
	t.Log(err)
	if n := specCalls.Load() - calls; n != 0 {
		t.Errorf("the create wrote the sandbox's spec files %d times before it failed to reserve the disk", n)
	}
	leftNothing("no room for the disk", free, "")
	release()

	// Room for the disk, not for the CRIU config.
	release = leaveFree(t, root, disk+64<<10)
	free = freeBytes(t, root)
	_, err = m.Lease(ctx, "full", LeaseRequest{})
	if !errdefs.IsResourceExhausted(err) || !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "criu.conf") {
		t.Fatalf("cold lease with room for the disk but not for a 1 MiB spec file: %v; want resource_exhausted naming criu.conf", err)
	}
	t.Log(err)
	leftNothing("no room for the CRIU config", free, "")

	// Room for the disk and the config; the task's start (a restore) finds none.
	specSize.Store(4 << 10)
	var cid string
	_, err = m.LeaseRestored(ctx, "full", LeaseRequest{}, func(ctx context.Context, c containerd.Container, l Layout, _ cio.Creator) (containerd.Task, error) {
		cid = c.ID()
		if mounted, err := isMountPoint(filepath.Dir(l.Upper)); err != nil || !mounted {
			t.Errorf("the disk is not mounted when the task starts: %v", err)
		}
		return nil, os.WriteFile(filepath.Join(containers, cid, "restore.img"), make([]byte, 1<<20), 0o600)
	})
	if !errors.Is(err, unix.ENOSPC) || cid == "" {
		t.Fatalf("restore that finds the state root full: %v; want its ENOSPC", err)
	}
	t.Log(err)
	leftNothing("no room for the restore", free, cid)
	release()

	if res, err = m.Lease(ctx, "full", LeaseRequest{}); err != nil {
		t.Fatalf("cold lease once the state root has room again: %v", err)
	}
}
