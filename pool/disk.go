package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// A sandbox's disk limit is a filesystem of its own: an ext4 image in the sandbox's directory,
// attached to a loop device and mounted over the overlay snapshot's directory (the parent of
// the upper and work dirs) before the task mounts its root. Writes past the image's size get
// ENOSPC inside the sandbox, at write(2). The image's blocks are reserved on the state root's
// filesystem when it is made (fallocate), and the loop device takes no discards, so nothing
// can hand them back (fstrim, a discard mount, a zeroout): a full state root can never fail
// the writeback of a sandbox's buffered writes, which the sandbox was told had succeeded. A
// sparse image would lose them (the kernel drops the pages with "Buffer I/O error"). Each
// image has its own UUID, so its own fanotify fsid: the change tracker marks it like any
// other filesystem. The loop device is auto-cleared when the filesystem is unmounted
// (destroy).

const diskImage = "disk.img"

// mkfsArgs make an ext4 without journal (a sandbox's layer does not outlive a host crash),
// without reserved blocks (root in the sandbox must not write past the limit), with lazily
// initialised inode tables (unwritten blocks read as zeros; the mount's noinit_itable keeps
// the kernel from zeroing them later) and without discarding the image (which would punch
// holes in it), in ~20 ms for 10 GiB.
var mkfsArgs = []string{"-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0",
	"-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard"}

// pendingDisk is a reserved disk image being formatted in the background.
type pendingDisk struct {
	img  string
	size int64 // 0: no disk limit
	done chan error
}

// reserveDisk makes the sandbox's directory and reserves its disk image of size bytes on the
// state root (no image when 0), then starts formatting the image in the background, so that
// mkfs runs while the container and its network are set up. It is the first write of a
// sandbox creation on the state root, so a state root without the room for the disk fails
// here, resource_exhausted naming the reservation, before any other file of the sandbox (its
// CRIU config, its init's log) could take the last blocks and fail with a plain error.
func (r *runtime) reserveDisk(ctx context.Context, cid string, size int64) (*pendingDisk, error) {
	dir := r.containerDir(cid)
	d := &pendingDisk{img: filepath.Join(dir, diskImage), size: size, done: make(chan error, 1)}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		if size == 0 {
			return nil, stateRootFull(fmt.Errorf("create the sandbox directory: %w", err))
		}
		return nil, stateRootFull(fmt.Errorf("reserve the sandbox disk (%s) on the state root: create the sandbox directory: %w",
			units.BytesSize(float64(size)), err))
	}
	if size == 0 {
		d.done <- nil
		return d, nil
	}
	if err := createImage(d.img, size); err != nil {
		return nil, err
	}
	go func() { d.done <- formatImage(ctx, d.img, size) }()
	return d, nil
}

// wait returns the outcome of formatting the image (the first call; nil afterwards).
func (d *pendingDisk) wait() error {
	err, ok := <-d.done
	if ok {
		close(d.done)
	}
	return err
}

// stateRootFull makes err, a failed write on the state root, resource_exhausted when the
// filesystem had no room (ENOSPC, EDQUOT): a sandbox creation that found the state root full
// is the caller's to retry once space is freed, not an internal error. err names what was
// written; other errors are returned as they are.
func stateRootFull(err error) error {
	if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) || errdefs.IsResourceExhausted(err) {
		return err
	}
	return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
}

// attachDisk mounts the prepared disk under the sandbox's writable layer.
func (r *runtime) attachDisk(ctx context.Context, cid string, l Layout, d *pendingDisk) (retErr error) {
	if err := d.wait(); err != nil || d.size == 0 {
		return err
	}
	size, img := d.size, d.img
	snap, err := snapshotDir(l)
	if err != nil {
		return err
	}
	dirs, err := statDirs(snap, ".", "fs", "work")
	if err != nil {
		return err
	}
	dev, err := attachLoop(img)
	if err != nil {
		return err
	}
	defer dev.Close() // the mount holds the device; auto-clear frees it at unmount
	if err := unix.Mount(dev.Name(), snap, "ext4", 0, "noinit_itable,nodiscard"); err != nil {
		return fmt.Errorf("mount disk of %s (%s) on %s: %w", cid, dev.Name(), snap, err)
	}
	defer func() {
		if retErr != nil {
			_ = unix.Unmount(snap, unix.MNT_DETACH)
		}
	}()
	for name, st := range dirs {
		p := filepath.Join(snap, name)
		if err := os.Mkdir(p, os.FileMode(st.Mode&0o7777)); err != nil && name != "." {
			return fmt.Errorf("disk of %s: %w", cid, err)
		}
		if err := os.Chown(p, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("disk of %s: %w", cid, err)
		}
		if err := os.Chmod(p, os.FileMode(st.Mode&0o7777)); err != nil { // past the umask
			return fmt.Errorf("disk of %s: %w", cid, err)
		}
	}
	log.L(ctx).Debug("sandbox disk attached", "container", cid, "bytes", size, "device", dev.Name())
	return nil
}

// snapshotDir returns the directory holding the overlay upper dir (the snapshot's own).
func snapshotDir(l Layout) (string, error) {
	snap := filepath.Dir(l.Upper)
	if filepath.Base(l.Upper) != "fs" || snap == "/" {
		return "", fmt.Errorf("overlay upper dir %s is not a snapshotter's <id>/fs: a disk limit needs the overlayfs snapshotter: %w", l.Upper, errdefs.ErrFailedPrecondition)
	}
	return snap, nil
}

func statDirs(parent string, names ...string) (map[string]*syscall.Stat_t, error) {
	out := map[string]*syscall.Stat_t{}
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(parent, n))
		if err != nil {
			return nil, fmt.Errorf("snapshot dir: %w", err)
		}
		out[n] = fi.Sys().(*syscall.Stat_t)
	}
	return out, nil
}

// makeImage makes a reserved, formatted disk image (createImage, then formatImage).
func makeImage(ctx context.Context, path string, size int64) error {
	if err := createImage(path, size); err != nil {
		return err
	}
	return formatImage(ctx, path, size)
}

// createImage creates the image file at path with all its size bytes allocated
// (reserveImage). A failed reservation leaves the file for the caller's cleanup to remove.
func createImage(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return stateRootFull(fmt.Errorf("reserve the sandbox disk (%s) on the state root: create %s: %w",
			units.BytesSize(float64(size)), path, err))
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create disk image %s: %w", path, err)
	}
	return reserveImage(path, size)
}

// formatImage makes the ext4 of a reserved image. mkfs zeroes ranges with fallocate: where
// the filesystem cannot zero a range in place (tmpfs) it punches a hole, so the holes left
// are reserved again (a stat when there are none).
func formatImage(ctx context.Context, path string, size int64) error {
	out, err := exec.CommandContext(ctx, "mkfs.ext4", append(mkfsArgs, path)...).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No space left on device") {
			return fmt.Errorf("format the sandbox disk %s: mkfs.ext4: %v: %s: %w: %w", path, err, tail(out, 300), unix.ENOSPC, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("mkfs.ext4 %s: %v: %s (install e2fsprogs, or set [sandbox] disk = \"0\"): %w", path, err, tail(out, 300), errdefs.ErrFailedPrecondition)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	if st.Blocks*512 < size {
		return reserveImage(path, size)
	}
	return nil
}

// reserveImage allocates every block of the image on the state root's filesystem (extending
// it to size). A state root without the room is resource_exhausted, naming what is free.
func reserveImage(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reserve disk image: %w", err)
	}
	defer f.Close()
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	for errors.Is(err, unix.EINTR) {
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT):
		var st unix.Statfs_t
		_ = unix.Fstatfs(int(f.Fd()), &st)
		return fmt.Errorf("reserve the sandbox disk (%s) on the state root: %s free at %s: %w: %w",
			units.BytesSize(float64(size)), units.BytesSize(float64(st.Bavail)*float64(st.Bsize)), filepath.Dir(filepath.Dir(path)), err, errdefs.ErrResourceExhausted)
	case errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("reserve the sandbox disk %s: the state root's filesystem cannot preallocate (fallocate): %w (put --root on ext4, XFS or tmpfs, or set [sandbox] disk = \"0\"): %w", path, err, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("reserve the sandbox disk %s: %w", path, err)
}

// attachLoop binds img to a free loop device (direct I/O when the backing filesystem allows
// it, so pages are not cached twice) that frees itself when its last user goes.
func attachLoop(img string) (*os.File, error) {
	backing, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("loop devices: %w (a disk limit needs the loop module): %w", err, errdefs.ErrFailedPrecondition)
	}
	defer ctl.Close()
	for range 16 { // another process may take the free device between the two calls
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: 4096,
			Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO}}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EINVAL) { // no direct I/O on this backing filesystem
			cfg.Size, cfg.Info.Flags = 0, unix.LO_FLAGS_AUTOCLEAR
			err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		}
		if err == nil {
			if err := noDiscard(dev.Name()); err != nil {
				_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
				dev.Close()
				return nil, err
			}
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("attach %s to a loop device: %w", img, err)
		}
	}
	return nil, fmt.Errorf("attach %s: no free loop device: %w", img, errdefs.ErrUnavailable)
}

// noDiscard makes the loop device refuse discards and unmapping zeroouts: the loop driver
// serves both by punching holes in the image, which would hand reserved blocks back to the
// state root (fstrim, run weekly by many distributions, trims every mounted filesystem). With
// discard_max_bytes at 0 the driver answers them EOPNOTSUPP and zeroouts write zeros into
// the reserved blocks instead. The setting outlives the device's binding; it is set anew at
// every attach.
func noDiscard(dev string) error {
	knob := "/sys/block/" + filepath.Base(dev) + "/queue/discard_max_bytes"
	if err := os.WriteFile(knob, []byte("0"), 0); err != nil {
		return fmt.Errorf("turn off discards of %s (they would unreserve the sandbox disk): %w", dev, err)
	}
	if got, err := os.ReadFile(knob); err != nil || strings.TrimSpace(string(got)) != "0" {
		return fmt.Errorf("turn off discards of %s: %s reads %q (%v): %w", dev, knob, got, err, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// detachDisk unmounts the sandbox's disk, if it has one; the loop device clears itself.
func detachDisk(l Layout) error {
	snap, err := snapshotDir(l)
	if err != nil {
		return nil // no disk on such a layout
	}
	if mounted, err := isMountPoint(snap); err != nil || !mounted {
		return err
	}
	if err := unix.Unmount(snap, 0); err != nil {
		if err := unix.Unmount(snap, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount disk %s: %w", snap, err)
		}
	}
	return nil
}

func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// mountedDisk is a sandbox disk found in the mount table.
type mountedDisk struct {
	mountPoint, device, image, cid string
}

// mountedDisks lists the loop-mounted sandbox disks whose image lies in containersDir.
func mountedDisks(containersDir string) ([]mountedDisk, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountedDisk
	for _, line := range strings.Split(string(data), "\n") {
		mp, src, ok := loopMount(line)
		if !ok {
			continue
		}
		backing, err := os.ReadFile("/sys/block/" + strings.TrimPrefix(src, "/dev/") + "/loop/backing_file")
		if err != nil {
			continue
		}
		img := strings.TrimSuffix(strings.TrimSpace(string(backing)), " (deleted)")
		if filepath.Base(img) != diskImage || filepath.Dir(filepath.Dir(img)) != filepath.Clean(containersDir) {
			continue
		}
		out = append(out, mountedDisk{mountPoint: mp, device: src, image: img, cid: filepath.Base(filepath.Dir(img))})
	}
	return out, nil
}

// UnmountDisks unmounts every sandbox disk whose image lies in containersDir (a pool root's
// "containers" directory) and whose container keep does not name (nil: all of them). Disks
// of containers deleted behind the daemon's back (ctr, a test's cleanup) are found this way.
func UnmountDisks(containersDir string, keep func(cid string) bool) error {
	disks, err := mountedDisks(containersDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range disks {
		if keep != nil && keep(d.cid) {
			continue
		}
		if err := unix.Unmount(d.mountPoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount disk of %s at %s: %w", d.cid, d.mountPoint, err))
		}
	}
	return errors.Join(errs...)
}

// ReserveDisks reserves the images of the sandbox disks mounted from containersDir again and
// turns their loop devices' discards off: disks made before images were reserved, or given
// holes since (a discard that slipped through), get every block back while the state root
// has the room. A disk that has all its blocks costs a stat.
func ReserveDisks(containersDir string) error {
	disks, err := mountedDisks(containersDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range disks {
		var st unix.Stat_t
		if err := unix.Stat(d.image, &st); err != nil {
			errs = append(errs, fmt.Errorf("disk of %s: %w", d.cid, err))
			continue
		}
		err := noDiscard(d.device)
		if st.Blocks*512 < st.Size { // holes: allocating over allocated extents costs ~25 ms per 10 GiB
			err = errors.Join(err, reserveImage(d.image, st.Size))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("disk of %s: %w", d.cid, err))
		}
	}
	return errors.Join(errs...)
}

// loopMount returns the mount point and source of a mountinfo line of an ext4 filesystem on
// a loop device.
func loopMount(line string) (mountPoint, source string, ok bool) {
	f := strings.Fields(line)
	for i := 6; i+2 < len(f); i++ {
		if f[i] == "-" {
			if f[i+1] != "ext4" || !strings.HasPrefix(f[i+2], "/dev/loop") || len(f) < 5 {
				return "", "", false
			}
			return unescapeMountinfo(f[4]), f[i+2], true
		}
	}
	return "", "", false
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space and the like).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
