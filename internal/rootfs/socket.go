package rootfs

import (
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// ChmodSocket sets the mode of the unix socket file at path, whose directory someone else
// can write (a sandbox's run directory): os.Chmod follows a symlink renamed over the socket
// between bind(2) and the chmod, onto any host file. The entry is opened O_PATH|O_NOFOLLOW,
// checked to be a socket, and changed through that fd.
func ChmodSocket(path string, mode uint32) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open socket %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := checkType(fd, path, unix.S_IFSOCK); err != nil {
		return err
	}
	// chmod(2) on the fd's /proc link changes the inode the fd holds (fchmod refuses O_PATH).
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
		return fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return nil
}
