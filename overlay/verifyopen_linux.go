//go:build linux

package overlay

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Verify walks the merged tree while the sandbox runs, and the sandbox can swap two names
// at any moment (renameat2(RENAME_EXCHANGE)): what the walk's stat saw is not what a later
// open of the same name gets. Opening a device node swapped in would run its driver's open
// on the host (a watchdog device reboots the machine on close), and a FIFO would block. So an
// entry is opened O_PATH first (which opens nothing: no driver, no FIFO), checked on that fd
// to be the very inode the stat saw, and only then reopened for reading through the fd.

// fileID is what the walk's stat saw of an entry: its type, device and inode.
type fileID struct {
	mode uint32
	dev  uint64
	ino  uint64
}

// errReplaced reports an entry that is no longer the one the walk's stat saw.
var errReplaced = errors.New("entry replaced since it was examined")

// sameID fails with errReplaced unless fd is the entry id describes.
func sameID(fd int, id fileID) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != id.mode&unix.S_IFMT || st.Dev != id.dev || st.Ino != id.ino {
		return fmt.Errorf("%w (now a file of type %#o, inode %d): %w", errReplaced, st.Mode&unix.S_IFMT, st.Ino, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// openExpected opens the regular file name in dirfd for reading, never following a symlink,
// opening a device or FIFO, or (where permitted) touching its atime; it fails with
// errReplaced unless the file is still the inode id.
func openExpected(dirfd int, name string, id fileID) (int, error) {
	if id.mode&unix.S_IFMT != unix.S_IFREG {
		return -1, fmt.Errorf("%w: not a regular file", errReplaced)
	}
	pfd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("%w: %w", errReplaced, err)
	}
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := sameID(pfd, id); err != nil {
		return -1, err
	}
	// Reopening through /proc/self/fd opens exactly the inode pfd holds, whatever name
	// points at by now.
	proc := "/proc/self/fd/" + strconv.Itoa(pfd)
	flags := unix.O_RDONLY | unix.O_NOCTTY | unix.O_NONBLOCK | unix.O_CLOEXEC
	fd, err := unix.Open(proc, flags|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = unix.Open(proc, flags, 0)
	}
	if err != nil {
		return -1, err
	}
	if err := sameID(fd, id); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// openDirExpected opens the directory name in dirfd for reading without following a
// symlink; it fails with errReplaced unless the directory is still the inode id. Opening
// O_DIRECTORY opens no device or FIFO, so no O_PATH step is needed.
func openDirExpected(dirfd int, name string, id fileID) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("%w: %w", errReplaced, err)
	}
	if err != nil {
		return -1, err
	}
	if err := sameID(fd, id); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
