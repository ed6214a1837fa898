//go:build linux

package overlay

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// apply executes a plan through the merged mount open as rootfd. Every parent is resolved
// inside the root without following symlinks, and every final component is handled with
// no-follow calls, so a symlink the sandbox planted is removed, never traversed.
func (pl *plan) apply(rootfd int) error {
	for _, p := range pl.remove {
		if err := removePath(rootfd, p); err != nil {
			return err
		}
	}
	linked := map[string]string{}
	for _, it := range pl.items {
		var err error
		if it.fix {
			err = withParent(rootfd, it.e.Path, func(pfd int, name string) error { return setAttrs(pfd, name, it.e, false) })
		} else {
			err = pl.create(rootfd, it.e, linked)
		}
		if err != nil {
			return err
		}
	}
	for _, e := range pl.dirTimes {
		err := withParent(rootfd, e.Path, func(pfd int, name string) error { return setMtime(pfd, name, e.Mtime) })
		if err != nil {
			return err
		}
	}
	return nil
}

// withParent runs fn with the parent directory of rel (resolved safely) and rel's name.
func withParent(rootfd int, rel string, fn func(pfd int, name string) error) error {
	pfd, name, err := openParent(rootfd, rel)
	if err != nil {
		return fmt.Errorf("resolve parent of %q: %w", rel, err)
	}
	defer unix.Close(pfd)
	if err := fn(pfd, name); err != nil {
		return fmt.Errorf("restore %q: %w", rel, err)
	}
	return nil
}

// removePath removes rel (recursively for a directory) from the merged tree. A path whose
// parent is not a real directory there does not exist and is left alone.
func removePath(rootfd int, rel string) error {
	pfd, name, err := openParent(rootfd, rel)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("resolve parent of %q: %w", rel, err)
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name); err != nil {
		return fmt.Errorf("remove %q: %w", rel, err)
	}
	return nil
}

// removeAt removes name from dirfd, descending into directories by fd.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readDirNames(fd)
	for _, n := range names {
		if err == nil {
			err = removeAt(fd, n)
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// create makes e in the merged tree (its parent exists by then) with all its attributes.
func (pl *plan) create(rootfd int, e *Entry, linked map[string]string) error {
	if first, ok := linked[e.Link]; ok && e.Link != "" {
		return linkPeer(rootfd, first, e.Path)
	}
	err := withParent(rootfd, e.Path, func(pfd int, name string) error {
		if err := pl.make(pfd, name, e); err != nil {
			return err
		}
		if pl.rawUpper && e.Opaque {
			if err := unix.Lsetxattr(procPath(pfd, name), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
				return fmt.Errorf("mark opaque: %w", err)
			}
		}
		return setAttrs(pfd, name, e, e.Kind != KindDir)
	})
	if err == nil && e.Link != "" {
		linked[e.Link] = e.Path
	}
	return err
}

// make creates the bare entry.
func (pl *plan) make(pfd int, name string, e *Entry) error {
	switch e.Kind {
	case KindDir:
		return unix.Mkdirat(pfd, name, 0o700)
	case KindFile:
		return writeFile(pfd, name, e, pl.srcs[e.Path])
	case KindSymlink:
		return unix.Symlinkat(e.Target, pfd, name)
	case KindFifo:
		return unix.Mknodat(pfd, name, unix.S_IFIFO|0o600, 0)
	case KindChar:
		return unix.Mknodat(pfd, name, unix.S_IFCHR|0o600, int(e.Rdev))
	case KindBlock:
		return unix.Mknodat(pfd, name, unix.S_IFBLK|0o600, int(e.Rdev))
	case KindSocket:
		return unix.Mknodat(pfd, name, unix.S_IFSOCK|0o600, 0)
	case KindWhiteout:
		if pl.rawUpper {
			return unix.Mknodat(pfd, name, unix.S_IFCHR, 0)
		}
	}
	return fmt.Errorf("cannot restore entry kind %q: %w", e.Kind, errdefs.ErrNotImplemented)
}

// writeFile creates a new regular file (never opening an existing one) with e's content.
func writeFile(pfd int, name string, e *Entry, src source) error {
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if e.Size == 0 {
		return nil
	}
	n, err := copyRange(src.fd, src.off, fd, 0, e.Size)
	if err != nil {
		return err
	}
	if n != e.Size {
		return fmt.Errorf("short content (%d of %d bytes): %w", n, e.Size, errdefs.ErrDataLoss)
	}
	return nil
}

// linkPeer hard-links path to an already restored member of its group.
func linkPeer(rootfd int, first, path string) error {
	ofd, oname, err := openParent(rootfd, first)
	if err != nil {
		return fmt.Errorf("resolve %q: %w", first, err)
	}
	defer unix.Close(ofd)
	return withParent(rootfd, path, func(pfd int, name string) error {
		return unix.Linkat(ofd, oname, pfd, name, 0)
	})
}

// setAttrs restores owner, mode, xattrs and (optionally) mtime of name in pfd.
func setAttrs(pfd int, name string, e *Entry, times bool) error {
	if err := unix.Fchownat(pfd, name, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if e.Kind != KindSymlink {
		if err := unix.Fchmodat(pfd, name, e.Mode, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := syncXattrs(procPath(pfd, name), e); err != nil {
		return err
	}
	if times {
		return setMtime(pfd, name, e.Mtime)
	}
	return nil
}

// setMtime sets the mtime of name (not following a symlink), leaving atime alone.
func setMtime(pfd int, name string, mtime int64) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime)}
	if err := unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

// syncXattrs makes the kept xattrs of p exactly e's.
func syncXattrs(p string, e *Entry) error {
	names, err := listXattrs(p)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, ok := e.Xattrs[n]; ok || !keptXattr(n) {
			continue
		}
		if err := unix.Lremovexattr(p, n); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("removexattr %s: %w", n, err)
		}
	}
	for n, v := range e.Xattrs {
		err := unix.Lsetxattr(p, n, v, 0)
		if err != nil && e.Kind == KindSymlink && strings.HasPrefix(n, "user.") && errors.Is(err, unix.EPERM) {
			continue // user.* is not allowed on symlinks
		}
		if err != nil {
			return fmt.Errorf("setxattr %s: %w", n, err)
		}
	}
	return nil
}
