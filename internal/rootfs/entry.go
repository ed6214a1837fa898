package rootfs

import (
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// The sandbox can rename entries at any time (renameat2(RENAME_EXCHANGE) swaps two names
// atomically), so what a stat saw is not what a later open by name gets. Every entry is
// therefore opened O_PATH first (which opens nothing: no device driver, no FIFO, no side
// effect), checked on that fd, and only then reopened for reading through the fd itself.

// openPath opens name in dirfd with O_PATH without following a final symlink and checks that
// it is still the entry want describes (type, device and inode) on a filesystem that may be
// copied. extra may add O_DIRECTORY.
func openPath(dirfd int, name string, want *unix.Stat_t, extra int) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC|extra, 0)
	if err != nil {
		return -1, err
	}
	if err := checkSame(fd, name, want); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := checkFS(fd, name); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// checkSame fails unless fd is the entry want describes.
func checkSame(fd int, name string, want *unix.Stat_t) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != want.Mode&unix.S_IFMT || st.Dev != want.Dev || st.Ino != want.Ino {
		return fmt.Errorf("%s was replaced while being copied (was %s, now %s): %w",
			name, typeName(want.Mode), typeName(st.Mode), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// reopenFile opens the regular file behind the O_PATH fd pfd for reading. Reopening through
// /proc/self/fd opens exactly that inode, whatever its name points at by now.
func reopenFile(pfd int, name string, want *unix.Stat_t) (int, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", name, err)
	}
	if err := checkSame(fd, name, want); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// checkType fails unless the open fd is of type ifmt (S_IFREG, S_IFDIR, ...).
func checkType(fd int, name string, ifmt uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != ifmt {
		return fmt.Errorf("%s is a %s, want a %s, refusing: %w", name, typeName(st.Mode), typeName(ifmt), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Pseudo filesystems whose files are kernel interfaces, not data: a copy never enters them
// (the host reads and writes them with its own privileges, not the sandbox's).
var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC: "proc", unix.SYSFS_MAGIC: "sysfs", unix.CGROUP_SUPER_MAGIC: "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2", unix.DEBUGFS_MAGIC: "debugfs", unix.TRACEFS_MAGIC: "tracefs",
	unix.SECURITYFS_MAGIC: "securityfs", unix.BPF_FS_MAGIC: "bpf", unix.DEVPTS_SUPER_MAGIC: "devpts",
	0x19800202: "mqueue", unix.PSTOREFS_MAGIC: "pstore", unix.EFIVARFS_MAGIC: "efivarfs",
	unix.SELINUX_MAGIC: "selinuxfs", unix.SMACK_MAGIC: "smackfs", 0x62656570: "configfs",
	0x65735543: "fusectl", unix.NSFS_MAGIC: "nsfs",
}

// checkFS refuses an fd on a pseudo filesystem.
func checkFS(fd int, name string) error {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return fmt.Errorf("statfs %s: %w", name, err)
	}
	if fs, ok := pseudoFS[int64(sfs.Type)]; ok {
		return fmt.Errorf("%s is on %s, a kernel interface, which is not copied: %w", name, fs, errdefs.ErrInvalidArgument)
	}
	return nil
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("file of type %#o", mode&unix.S_IFMT)
}
