package rootfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Entry is one directory entry as Lstat saw it.
type Entry struct {
	Name string
	Stat unix.Stat_t
}

// ReadDir lists the directory rel (without . and ..), each entry lstat'ed, never following a
// symlink. Entries that vanish while listed are left out.
func (r *Root) ReadDir(rel string) ([]Entry, error) {
	fd, err := r.openDir(rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	names, err := readNames(fd, "/"+rel)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		out = append(out, Entry{Name: n, Stat: st})
	}
	return out, nil
}

// SandboxID is the id the sandbox sees for a host uid or gid (see IDMap.FromHost).
func (r *Root) SandboxID(hostID uint32) uint32 { return uint32(r.ids.FromHost(hostID)) }

// ownNew gives what an op made to the sandbox's root when the sandbox has its own user
// namespace (host root is nobody inside it). fd is the new entry, or -1 to name it by
// base in pfd (without following a symlink).
func (r *Root) ownNew(fd, pfd int, base string) error {
	if r.ids.Size == 0 {
		return nil
	}
	id, err := r.ids.ToHost(0)
	if err != nil {
		return err
	}
	if fd >= 0 {
		return unix.Fchown(fd, id, id)
	}
	return unix.Fchownat(pfd, base, id, id, unix.AT_SYMLINK_NOFOLLOW)
}

// MkdirAll makes the directory rel and its missing parents with mode; it reports whether rel
// was made (false: it existed as a directory). An existing non-directory is a conflict.
func (r *Root) MkdirAll(rel string, mode uint32) (bool, error) {
	if rel == "" {
		return false, nil
	}
	made := false
	cur := ""
	for _, c := range strings.Split(rel, "/") {
		cur = path.Join(cur, c)
		pfd, base, err := r.openParent(cur)
		if err != nil {
			return made, err
		}
		err = unix.Mkdirat(pfd, base, mode)
		made = err == nil
		if made {
			err = r.ownNew(-1, pfd, base)
		}
		if errors.Is(err, unix.EEXIST) {
			var st unix.Stat_t
			if err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				err = fmt.Errorf("/%s exists and is a %s: %w", cur, typeName(st.Mode), errdefs.ErrAlreadyExists)
			}
		}
		unix.Close(pfd)
		if err != nil {
			return false, r.pathError(cur, err)
		}
	}
	return made, nil
}

// WriteFile replaces the regular file rel with the contents of body (mode for a new file),
// making missing parent directories; an existing symlink there is replaced, never followed.
func (r *Root) WriteFile(rel string, body io.Reader, mode uint32) (int64, error) {
	if rel == "" {
		return 0, fmt.Errorf("cannot write the root directory: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := r.MkdirAll(path.Dir(rel), 0o755); err != nil && path.Dir(rel) != "." {
		return 0, err
	}
	pfd, base, err := r.openParent(rel)
	if err != nil {
		return 0, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0, fmt.Errorf("/%s is a directory: %w", rel, errdefs.ErrInvalidArgument)
	}
	f, n, err := writeFileAt(pfd, base, mode, body)
	if err != nil {
		return n, fmt.Errorf("write /%s: %w", rel, err)
	}
	if err := r.ownNew(int(f.Fd()), -1, ""); err != nil {
		f.Close()
		return n, fmt.Errorf("chown /%s: %w", rel, err)
	}
	return n, f.Close()
}

// OpenFile opens the regular file rel for reading; anything else (a symlink, a FIFO, a
// device) is refused.
func (r *Root) OpenFile(rel string) (*os.File, unix.Stat_t, error) {
	st, err := r.Lstat(rel)
	if err != nil {
		return nil, st, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, fmt.Errorf("/%s is a %s, not a regular file: %w", rel, typeName(st.Mode), errdefs.ErrInvalidArgument)
	}
	pfd, base, err := r.openParent(rel)
	if err != nil {
		return nil, st, err
	}
	defer unix.Close(pfd)
	opath, err := openPath(pfd, base, &st, 0)
	if err != nil {
		return nil, st, r.pathError(rel, err)
	}
	defer unix.Close(opath)
	fd, err := reopenFile(opath, "/"+rel, &st)
	if err != nil {
		return nil, st, err
	}
	return os.NewFile(uintptr(fd), "/"+rel), st, nil
}

// Rename moves src to dst (both beneath the root), making dst's missing parents.
func (r *Root) Rename(src, dst string) error {
	if src == "" || dst == "" {
		return fmt.Errorf("cannot move the root directory: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := r.MkdirAll(path.Dir(dst), 0o755); err != nil && path.Dir(dst) != "." {
		return err
	}
	sfd, sbase, err := r.openParent(src)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	dfd, dbase, err := r.openParent(dst)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Renameat(sfd, sbase, dfd, dbase); err != nil {
		return r.pathError(src, err)
	}
	return nil
}

// RemoveAll removes rel, and everything under it when it is a directory (a symlink is
// removed, never followed; other mounts are not entered).
func (r *Root) RemoveAll(rel string) error {
	if rel == "" {
		return fmt.Errorf("cannot remove the root directory: %w", errdefs.ErrInvalidArgument)
	}
	st, err := r.Lstat(rel)
	if err != nil {
		return err
	}
	pfd, base, err := r.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	flags := 0
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if _, err := clearSubdir(pfd, base, "/"+rel, &st, 0); err != nil {
			return err
		}
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(pfd, base, flags); err != nil {
		return r.pathError(rel, err)
	}
	return nil
}
