package pool

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/rootfs"
)

// What a lease leaves outside the overlay (which the Reset hook rolls back) is removed before
// the sandbox is leased again: the contents of its tmpfs and mqueue mounts, the System V IPC
// objects of its IPC namespace, stray files in /.deltabox/run and anything a tenant put into
// /dev. Processes are gone already (killed through the cgroup), the network namespace holds
// no socket without a process, and the environment is set per exec. Any step that fails
// makes the release destroy the sandbox instead of reusing it.

const mqueueMagic = 0x19800202

// tenantDirs are the sandbox's mounts whose contents are cleared, when they are on tmpfs
// (or mqueue): on the overlay they are rolled back with it.
var tenantDirs = []string{"dev/shm", "dev/mqueue", "run", "tmp"}

// devNodes are the device nodes runc creates in /dev (major, minor); devLinks its symlinks.
var (
	devNodes = map[string][2]uint32{"null": {1, 3}, "zero": {1, 5}, "full": {1, 7}, "random": {1, 8},
		"urandom": {1, 9}, "tty": {5, 0}}
	devLinks = map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx", "core": "/proc/kcore"}
	runKeep = map[string]bool{"init.sock": true, "api.sock": true}
)

// scrubTenant removes the previous tenant's residue (see above) from a sandbox whose
// processes but init were killed.
func (m *Manager) scrubTenant(ctx context.Context, sb *sandbox) error {
	start := time.Now()
	ref := sb.inst.ref.Load()
	rootf, err := ref.openRoot()
	if err != nil {
		return err
	}
	defer rootf.Close()
	root, err := rootfs.Open(FDPath(rootf))
	if err != nil {
		return err
	}
	defer root.Close()
	n, err := clearTenantDirs(root)
	if err != nil {
		return err
	}
	if err := scrubDev(root); err != nil {
		return err
	}
	run, err := rootfs.Open(sb.inst.runDir)
	if err != nil {
		return err
	}
	defer run.Close()
	if _, err := run.Clear("", func(name string, st *unix.Stat_t, _ bool) bool {
		return runKeep[name] && st.Mode&unix.S_IFMT == unix.S_IFSOCK
	}); err != nil {
		return fmt.Errorf("clear %s: %w", runPath, err)
	}
	objs, err := ref.clearIPC()
	if err != nil {
		return err
	}
	log.L(ctx).Debug("tenant residue removed", "container", sb.rec.CID, "entries", n, "ipc_objects", objs, "took", time.Since(start))
	return nil
}

// clearTenantDirs empties the tmpfs and mqueue mounts among tenantDirs.
func clearTenantDirs(root *rootfs.Root) (int, error) {
	total := 0
	for _, d := range tenantDirs {
		var sfs unix.Statfs_t
		if !onFS(root, d, &sfs) {
			continue
		}
		n, err := root.Clear(d, nil, unix.TMPFS_MAGIC, mqueueMagic)
		total += n
		if err != nil {
			return total, fmt.Errorf("clear the sandbox's /%s: %w", d, err)
		}
	}
	return total, nil
}

// onFS reports whether d exists in the sandbox as a directory on tmpfs or mqueue.
func onFS(root *rootfs.Root, d string, sfs *unix.Statfs_t) bool {
	var err error
	*sfs, err = root.StatfsDir(d)
	return err == nil && (sfs.Type == unix.TMPFS_MAGIC || sfs.Type == mqueueMagic)
}

// scrubDev removes from the sandbox's /dev (a tmpfs) everything but runc's device nodes,
// symlinks and mountpoints, and fails unless every node runc made is still there as made.
func scrubDev(root *rootfs.Root) error {
	var sfs unix.Statfs_t
	if !onFS(root, "dev", &sfs) {
		return nil
	}
	if _, err := root.Clear("dev", keepDev(root), unix.TMPFS_MAGIC); err != nil {
		return fmt.Errorf("clear the sandbox's /dev: %w", err)
	}
	for name, mm := range devNodes {
		st, err := root.Lstat("dev/" + name)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != mm[0] || unix.Minor(st.Rdev) != mm[1] {
			return fmt.Errorf("the sandbox's /dev/%s is gone or was replaced: not reusable (%v)", name, err)
		}
	}
	return nil
}

func keepDev(root *rootfs.Root) rootfs.Keep {
	return func(name string, st *unix.Stat_t, mountpoint bool) bool {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			mm, ok := devNodes[name]
			return ok && unix.Major(st.Rdev) == mm[0] && unix.Minor(st.Rdev) == mm[1]
		case unix.S_IFLNK:
			target, err := root.Readlink("dev/" + name)
			return err == nil && devLinks[name] == target
		case unix.S_IFDIR:
			return mountpoint
		}
		return false
	}
}
