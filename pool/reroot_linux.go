package pool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Rerooting a warm sandbox onto a fork layer (fork --from without processes, forklower.go).
//
// A ready sandbox runs only its init, on the root filesystem its task mounted: the image's
// layers under the snapshot's upper dir. Making a new container for each fork costs the host
// 100+ ms of CPU (containerd, shim, runc, network, init); moving a ready one onto the fork
// layer costs a mount and a pivot:
//
//  1. the new root is mounted on the host, detached: the same overlay as the task's (the
//     snapshot's upper and work dirs, the image's layers idmapped as for the task) with the
//     fork layer stacked above the image's layers;
//  2. a thread that entered the sandbox's mount namespace (setns through the init's pidfd)
//     attaches it on /.deltabox, moves every mount of the old root (proc, dev, sys, the
//     init's binds, with what is mounted below them) to the same place in the new root, and
//     pivots: the kernel gives every process whose root was the old root (the init: it is
//     checked to have its root and working directory there) the new one, and the old root
//     is detached.
//
// The upper dir is shared by the old and the new overlay for that moment: the old one is idle
// (nothing but the init runs, and the init does not write to its root), and the overlay
// module must have its inodes index off (two mounts of one upper dir are refused otherwise,
// and the sandbox is created instead). What the upper dir holds shadows the layer, so only a
// sandbox whose upper dir holds what its task's start left there (mount point directories
// and empty files, as on a new container) is rerooted.

// rerootMountPoint is where the new root is attached in the old one before the pivot: a
// directory every sandbox has (the parent of the init's binds) and that is no mount point.
const rerootMountPoint = "/.deltabox"

// errNotReroutable says a ready sandbox cannot be moved onto a fork layer (it is created
// instead).
var errNotReroutable = errors.New("the sandbox cannot be moved onto a fork layer")

// indexOff checks that the overlay of mounts has its inodes index off (an index=off option,
// as containerd's snapshotter gives, or the module's default): the old and the new overlay
// share the upper dir for a moment, which the kernel refuses with the index on.
func indexOff(mounts []mount.Mount) error {
	if len(mounts) != 1 || mounts[0].Type != "overlay" {
		return fmt.Errorf("a root filesystem of %d mounts, not one overlay: %w", len(mounts), errNotReroutable)
	}
	index := ""
	for _, o := range mounts[0].Options {
		if v, ok := strings.CutPrefix(o, "index="); ok {
			index = v // the last one wins
		}
	}
	if index == "" {
		b, _ := os.ReadFile("/sys/module/overlay/parameters/index")
		if strings.TrimSpace(string(b)) == "N" {
			index = "off"
		}
	}
	if index != "off" {
		return fmt.Errorf("the overlay's inodes index is not off: %w", errNotReroutable)
	}
	return nil
}

// rerootable checks that inst, a ready sandbox, can be moved onto a fork layer: an init whose
// root and working directory are its root filesystem's root, and an upper dir that holds
// nothing but directories without overlay attributes and empty files.
func rerootable(inst *instance) error {
	ref := inst.ref.Load()
	if err := ref.usable(); err != nil {
		return err
	}
	var root, cwd unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/root", ref.pid), &root); err != nil {
		return err
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/cwd", ref.pid), &cwd); err != nil {
		return err
	}
	if root.Dev != cwd.Dev || root.Ino != cwd.Ino {
		return fmt.Errorf("its init's working directory is not its root: %w", errNotReroutable)
	}
	return pristineUpper(inst.layout.Upper)
}

// pristineUpper checks that an upper dir holds only what a task's start makes: directories
// (no whiteouts, no opaque or redirected ones) and empty regular files (mount points, no
// metadata-only copies).
func pristineUpper(upper string) error {
	return filepath.WalkDir(upper, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return fmt.Errorf("%s in its upper dir is a %s: %w", path, d.Type(), errNotReroutable)
		}
		if name := shadowingXattr(path); name != "" {
			return fmt.Errorf("%s in its upper dir has %s: %w", path, name, errNotReroutable)
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if fi.Size() != 0 {
				return fmt.Errorf("%s in its upper dir is not empty: %w", path, errNotReroutable)
			}
		}
		return nil
	})
}

// shadowingXattr returns the first overlay attribute of path that changes what the merged
// view shows (opaque, redirect, metacopy; origin, impure and uuid do not), or "".
func shadowingXattr(path string) string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return ""
		}
		return "unreadable attributes (" + err.Error() + ")"
	}
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		s := string(name)
		for _, prefix := range []string{"trusted.overlay.", "user.overlay."} {
			switch strings.TrimPrefix(s, prefix) {
			case "opaque", "redirect", "metacopy":
				if strings.HasPrefix(s, prefix) {
					return s
				}
			}
		}
	}
	return ""
}

// reroot moves inst's init onto a root filesystem made of mounts (the task's overlay with a
// fork layer stacked: stackedMounts). On failure before the pivot the sandbox keeps its old
// root; after it, it is broken: the caller destroys it either way.
// tmp is a private directory of the host where mounts may be made for a moment.
func reroot(inst *instance, mounts []mount.Mount, tmp string, sp *spans) error {
	ref := inst.ref.Load()
	if err := ref.usable(); err != nil {
		return err
	}
	children, err := rootChildren(ref.pid)
	if err != nil {
		return err
	}
	if err := indexOff(mounts); err != nil {
		return err
	}
	newRoot, err := detachedOverlay(mounts[0], ref.pid, tmp)
	if err != nil {
		return err
	}
	defer unix.Close(newRoot)
	if err := ref.alive(); err != nil { // its pid named it while its namespace was opened
		return err
	}
	sp.mark("mount")
	pidfd, err := unix.FcntlInt(ref.pidfd.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("duplicate the init's pidfd: %w", err)
	}
	defer unix.Close(pidfd)
	errc := make(chan error, 1)
	go func() {
		// The thread enters the sandbox's mount namespace and is never given back: it ends
		// with the goroutine (LockOSThread without Unlock).
		goruntime.LockOSThread()
		errc <- pivotInNamespace(pidfd, newRoot, children)
	}()
	if err := <-errc; err != nil {
		return err
	}
	sp.mark("pivot")
	return ref.rebindRoot()
}

// detachedOverlay makes the overlay mount m (a snapshot's, options as containerd gives
// them) as a detached mount (fsopen, fsmount). With uidmap/gidmap options, the lower dirs are
// opened through one idmapped copy of their common parent made with the user namespace of the
// process pid (the sandbox's init: the mapping is its own), as containerd's mount does with
// a namespace it forks a process for.
func detachedOverlay(m mount.Mount, pid uint32, tmp string) (int, error) {
	if m.Type != "overlay" {
		return -1, fmt.Errorf("root filesystem of type %q, not overlay: %w", m.Type, errNotReroutable)
	}
	var lowers []string
	idmapped := false
	var rest []string
	for _, o := range m.Options {
		switch k, v, _ := strings.Cut(o, "="); k {
		case "lowerdir":
			lowers = strings.Split(v, ":")
		case "uidmap", "gidmap":
			idmapped = true
		default:
			rest = append(rest, o)
		}
	}
	if len(lowers) == 0 {
		return -1, fmt.Errorf("overlay without lower dirs: %w", errNotReroutable)
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	release, err := setLowers(fsfd, lowers, idmapped, pid, tmp)
	if err != nil {
		return -1, err
	}
	defer release()
	attrs := 0
	for _, o := range rest {
		var err error
		switch k, v, hasValue := strings.Cut(o, "="); {
		case o == "rw":
		case o == "ro":
			attrs |= unix.MOUNT_ATTR_RDONLY
		case hasValue:
			err = unix.FsconfigSetString(fsfd, k, v)
		default:
			err = unix.FsconfigSetFlag(fsfd, k)
		}
		if err != nil {
			return -1, fmt.Errorf("overlay option %q: %w", o, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("create the overlay: %w", err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount the overlay: %w", err)
	}
	return fd, nil
}

// setLowers gives the overlay of fsfd its lower dirs (topmost first), through an idmapped
// copy of their common parent when idmapped: attached below tmp (overlay takes its own
// private copies of attached mounts only) until release, after the overlay was created.
func setLowers(fsfd int, lowers []string, idmapped bool, pid uint32, tmp string) (release func(), err error) {
	if !idmapped {
		for _, l := range lowers {
			if err := unix.FsconfigSetString(fsfd, "lowerdir+", l); err != nil {
				return nil, fmt.Errorf("overlay lower dir %s: %w", l, err)
			}
		}
		return func() {}, nil
	}
	common := commonParent(lowers)
	if common == "/" {
		return nil, fmt.Errorf("lower dirs %v share no parent to idmap: %w", lowers, errNotReroutable)
	}
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("user namespace of the sandbox: %w", err)
	}
	defer unix.Close(userns)
	idm, err := unix.OpenTree(unix.AT_FDCWD, common, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, fmt.Errorf("clone %s: %w", common, err)
	}
	defer unix.Close(idm)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY, Userns_fd: uint64(userns), Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(idm, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return nil, fmt.Errorf("idmap %s: %w", common, err)
	}
	dir, err := os.MkdirTemp(tmp, "idmapped-")
	if err != nil {
		return nil, err
	}
	if err := unix.MoveMount(idm, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("attach the idmapped %s: %w", common, err)
	}
	release = func() {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		_ = os.Remove(dir)
	}
	for _, l := range lowers {
		p := filepath.Join(dir, strings.TrimPrefix(l, common))
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", p); err != nil {
			release()
			return nil, fmt.Errorf("overlay lower dir %s: %w", l, err)
		}
	}
	return release, nil
}

// commonParent returns the deepest directory all of dirs (absolute, clean) are below.
func commonParent(dirs []string) string {
	common := filepath.Dir(dirs[0])
	for _, d := range dirs[1:] {
		for common != "/" && !strings.HasPrefix(d, common+"/") {
			common = filepath.Dir(common)
		}
	}
	return common
}

// pivotInNamespace runs on a locked thread it spoils: it enters the mount namespace of the
// process of pidfd, attaches newRoot on rerootMountPoint, moves the old root's children
// (mount points relative to the root) into it and pivots.
func pivotInNamespace(pidfd, newRoot int, children []string) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare the thread's fs: %w", err)
	}
	if err := unix.Setns(pidfd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the sandbox's mount namespace: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if mp, err := isMountPoint(rerootMountPoint); err != nil || mp {
		return fmt.Errorf("%s in the sandbox is a mount point (%v): %w", rerootMountPoint, err, errdefs.ErrFailedPrecondition)
	}
	// Hold every child of the old root before the new root hides the ones below its mount
	// point.
	held := make([]int, len(children))
	for i := range held {
		held[i] = -1
	}
	defer func() {
		for _, fd := range held {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	for i, mp := range children {
		fd, err := unix.OpenTree(unix.AT_FDCWD, mp, unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return fmt.Errorf("hold mount %s: %w", mp, err)
		}
		held[i] = fd
	}
	if err := unix.MoveMount(newRoot, "", unix.AT_FDCWD, rerootMountPoint, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the new root: %w", err)
	}
	for i, mp := range children {
		if err := unix.MoveMount(held[i], "", unix.AT_FDCWD, rerootMountPoint+mp, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("move mount %s into the new root: %w", mp, err)
		}
	}
	if err := unix.Chdir(rerootMountPoint); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot to the new root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

// rootChildren lists the mount points (relative to its root, as it sees them) of the mounts
// whose parent is the root mount of pid, in mount order.
func rootChildren(pid uint32) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	out, err := parseRootChildren(data)
	if err != nil {
		return nil, fmt.Errorf("mounts of pid %d: %w", pid, err)
	}
	return out, nil
}

// parseRootChildren is rootChildren on the text of a mountinfo file.
func parseRootChildren(data []byte) ([]string, error) {
	type entry struct{ id, parent, mp string }
	var ents []entry
	rootID := ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		e := entry{id: f[0], parent: f[1], mp: unescapeMountinfo(f[4])}
		if e.mp == "/" && rootID == "" {
			rootID = e.id
		}
		ents = append(ents, e)
	}
	if rootID == "" {
		return nil, fmt.Errorf("no root mount: %w", errdefs.ErrFailedPrecondition)
	}
	var out []string
	for _, e := range ents {
		if e.parent != rootID || e.id == rootID {
			continue
		}
		if e.mp == "/" || !filepath.IsAbs(e.mp) || filepath.Clean(e.mp) != e.mp {
			return nil, fmt.Errorf("mount %s at %q over the root: %w", e.id, e.mp, errNotReroutable)
		}
		if e.mp == rerootMountPoint {
			return nil, fmt.Errorf("%s is a mount point: %w", rerootMountPoint, errNotReroutable)
		}
		out = append(out, e.mp)
	}
	return out, nil
}

// rebindRoot opens the init's root again (after a reroot).
func (r *initRef) rebindRoot() error {
	root, err := os.OpenFile("/proc/"+strconv.Itoa(int(r.pid))+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("root of sandbox init %d: %w", r.pid, err)
	}
	if err := r.alive(); err != nil {
		root.Close()
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retired {
		root.Close()
		return fmt.Errorf("sandbox init (pid %d) was replaced or destroyed: %w", r.pid, errdefs.ErrFailedPrecondition)
	}
	old := r.root
	r.root = root
	if old != nil {
		old.Close()
	}
	return nil
}
