//go:build linux

package initproto

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ErrNotListening means no init listens on the socket: nothing was sent, so the request
// reached no process (callers may take another path, such as containerd's task exec).
var ErrNotListening = fmt.Errorf("sandbox init is not listening: %w", errdefs.ErrUnavailable)

// dialSocket connects to the unix socket at path without ever following a symlink in its
// last component: the sandbox can write the socket's directory and could otherwise point
// the host at any host socket. Parent directories are host-owned and trusted.
func dialSocket(ctx context.Context, path string) (*net.UnixConn, error) {
	fd, err := openSocketPath(path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("connect to init socket %s: %v: %w", path, err, ErrNotListening)
	}
	return conn.(*net.UnixConn), nil
}

// openSocketPath opens path with O_PATH|O_NOFOLLOW and checks that it is a socket.
func openSocketPath(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, classifyOpenError(path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat init socket %s: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return -1, fmt.Errorf("init socket %s is not a socket (mode %#o), refusing: %w",
			path, st.Mode&unix.S_IFMT, errdefs.ErrPermissionDenied)
	}
	return fd, nil
}

func classifyOpenError(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("init socket %s: %v: %w", path, err, ErrNotListening)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("init socket %s is a symlink, refusing: %w", path, errdefs.ErrPermissionDenied)
	}
	return fmt.Errorf("open init socket %s: %v: %w", path, err, errdefs.ErrUnavailable)
}

// checkPeer reads the server's credentials (SO_PEERCRED) and asks check about them.
func checkPeer(conn *net.UnixConn, path string, check PeerCheck) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("init socket %s: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || serr != nil {
		return fmt.Errorf("peer credentials of init socket %s: %v: %w", path, errors.Join(err, serr), errdefs.ErrUnavailable)
	}
	if err := check(cred.Pid, cred.Uid, cred.Gid); err != nil {
		return fmt.Errorf("init socket %s: %w", path, err)
	}
	return nil
}
