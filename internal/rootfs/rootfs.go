// Package rootfs copies files into and out of a directory tree that someone else controls
// (a sandbox's root) as tar streams, without ever following a symlink or a ".." out of it.
// Every path is resolved from a directory fd with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS), so a sandbox that swaps a directory for a symlink mid-copy gets an
// error, not a write on the host. Archive/tar and continuity's helpers resolve paths by name
// (check, then use), which is racy against a running sandbox; hence this small package.
package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Root is an open directory that all paths are resolved beneath.
type Root struct {
	fd   int
	name string // for messages
	ids  IDMap  // owners as the sandbox sees them (WithIDMap)
}

// Open opens dir as a Root. dir itself is trusted (e.g. /proc/PID/root).
func Open(dir string, opts ...Option) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", dir, err)
	}
	r := &Root{fd: fd, name: dir}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// Close releases the root's fd.
func (r *Root) Close() error { return unix.Close(r.fd) }

// CleanPath validates a user-given absolute or relative path inside the root and returns it
// relative to the root ("" for the root itself). A ".." component is refused outright.
func CleanPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path: %w", errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", fmt.Errorf("path %q climbs out of the sandbox root with \"..\": %w", p, errdefs.ErrInvalidArgument)
		}
	}
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	return rel, nil
}

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openDir opens the directory rel beneath the root without following any symlink.
func (r *Root) openDir(rel string) (int, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags,
	})
	if err != nil {
		return -1, r.pathError(rel, err)
	}
	if err := checkFS(fd, "/"+rel); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// openParent opens the parent directory of rel and returns it with rel's last component.
func (r *Root) openParent(rel string) (int, string, error) {
	if rel == "" {
		return -1, "", fmt.Errorf("the root itself has no parent: %w", errdefs.ErrInvalidArgument)
	}
	dir, base := path.Split(rel)
	fd, err := r.openDir(strings.TrimSuffix(dir, "/"))
	return fd, base, err
}

// pathError turns resolution errors into classed, readable errors.
func (r *Root) pathError(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("/%s passes through a symlink, which is refused: %w", rel, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("/%s: no such file or directory: %w", rel, errdefs.ErrNotFound)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("/%s: not a directory: %w", rel, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("/%s: %w", rel, err)
}

// Lstat describes rel without following a final symlink.
func (r *Root) Lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if rel == "" {
		err := unix.Fstat(r.fd, &st)
		return st, err
	}
	pfd, base, err := r.openParent(rel)
	if err != nil {
		return st, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, r.pathError(rel, err)
	}
	return st, nil
}

func fileMode(st *unix.Stat_t) os.FileMode {
	m := os.FileMode(st.Mode & 0o777)
	if st.Mode&unix.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}
