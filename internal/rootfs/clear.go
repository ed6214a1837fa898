package rootfs

import (
	"fmt"
	"os"
	"path"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// maxClearDepth bounds how deep Clear descends; a deeper tree is an error (the caller then
// discards the sandbox instead of reusing it).
const maxClearDepth = 128

// Keep reports whether Clear leaves an entry of the cleared directory itself in place;
// mountpoint says the entry is a directory with another filesystem mounted on it.
type Keep func(name string, st *unix.Stat_t, mountpoint bool) bool

// Clear empties the directory rel beneath the root and returns how many entries it removed.
// fsTypes, when given, are the statfs magics rel must be on (else it fails, removing
// nothing). Entries are removed with unlinkat from directory fds, so no symlink is ever
// followed; subdirectories are opened with RESOLVE_NO_XDEV and never crossed into another
// mount. keep (may be nil) spares entries of rel itself; a mountpoint that keep does not
// spare is an error. Meant for a directory no process writes to any more (a released
// sandbox's tmpfs): what a racing writer adds may survive, but nothing outside is touched.
func (r *Root) Clear(rel string, keep Keep, fsTypes ...int64) (int, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags,
	})
	if err != nil {
		return 0, r.pathError(rel, err)
	}
	defer unix.Close(fd)
	if len(fsTypes) > 0 {
		var sfs unix.Statfs_t
		if err := unix.Fstatfs(fd, &sfs); err != nil {
			return 0, fmt.Errorf("statfs /%s: %w", rel, err)
		}
		if !hasType(fsTypes, int64(sfs.Type)) {
			return 0, fmt.Errorf("/%s is on filesystem %#x, not the one expected (%#x): %w", rel, sfs.Type, fsTypes, errdefs.ErrFailedPrecondition)
		}
	}
	return clearAt(fd, "/"+rel, keep, 0)
}

func hasType(types []int64, t int64) bool {
	for _, x := range types {
		if x == t {
			return true
		}
	}
	return false
}

// clearAt removes the entries of the directory dfd (named name in messages).
func clearAt(dfd int, name string, keep Keep, depth int) (int, error) {
	if depth > maxClearDepth {
		return 0, fmt.Errorf("%s is nested more than %d directories deep: %w", name, maxClearDepth, errdefs.ErrFailedPrecondition)
	}
	var dst unix.Stat_t
	if err := unix.Fstat(dfd, &dst); err != nil {
		return 0, fmt.Errorf("stat %s: %w", name, err)
	}
	names, err := readNames(dfd, name)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, e, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return n, fmt.Errorf("stat %s: %w", path.Join(name, e), err)
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		mount := isDir && st.Dev != dst.Dev
		if keep != nil && keep(e, &st, mount) {
			continue
		}
		if mount {
			return n, fmt.Errorf("%s is a mountpoint, which is not cleared: %w", path.Join(name, e), errdefs.ErrFailedPrecondition)
		}
		if isDir {
			m, err := clearSubdir(dfd, e, path.Join(name, e), &st, depth)
			n += m
			if err != nil {
				return n, err
			}
		}
		flags := 0
		if isDir {
			flags = unix.AT_REMOVEDIR
		}
		if err := unix.Unlinkat(dfd, e, flags); err != nil {
			return n, fmt.Errorf("remove %s: %w", path.Join(name, e), err)
		}
		n++
	}
	return n, nil
}

// clearSubdir empties the subdirectory e of dfd, which must still be the one st describes.
func clearSubdir(dfd int, e, name string, st *unix.Stat_t, depth int) (int, error) {
	fd, err := unix.Openat2(dfd, e, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolveFlags | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(fd)
	if err := checkSame(fd, name, st); err != nil {
		return 0, err
	}
	return clearAt(fd, name, nil, depth+1)
}

// readNames lists the directory dfd (without . and ..) through a duplicate of the fd.
func readNames(dfd int, name string) ([]string, error) {
	dup, err := unix.FcntlInt(uintptr(dfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate fd of %s: %w", name, err)
	}
	f := os.NewFile(uintptr(dup), name)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", name, err)
	}
	return names, nil
}

// StatfsDir describes the filesystem of the directory rel (of any type, pseudo ones too),
// resolved without following a symlink.
func (r *Root) StatfsDir(rel string) (unix.Statfs_t, error) {
	var sfs unix.Statfs_t
	fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags})
	if err != nil {
		return sfs, r.pathError(rel, err)
	}
	defer unix.Close(fd)
	err = unix.Fstatfs(fd, &sfs)
	return sfs, err
}

// Readlink returns the target of the symlink rel without following anything.
func (r *Root) Readlink(rel string) (string, error) {
	pfd, base, err := r.openParent(rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	return readlinkat(pfd, base)
}
