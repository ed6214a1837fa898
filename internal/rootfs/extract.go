package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ExtractOptions tune Extract.
type ExtractOptions struct {
	Chown bool // apply the entries' uid/gid
}

// ExtractResult counts what Extract wrote.
type ExtractResult struct {
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

// Extract unpacks the tar stream tr to dest, docker-cp style: when dest is an existing
// directory the entries land inside it; otherwise the stream's top-level entry is renamed to
// dest (whose parent must exist). Entry names with "..", absolute names and any path through
// a symlink are refused; an existing symlink at a destination is replaced, never followed.
func (r *Root) Extract(dest string, tr *tar.Reader, opts ExtractOptions) (ExtractResult, error) {
	var res ExtractResult
	rel, err := CleanPath(dest)
	if err != nil {
		return res, err
	}
	st, err := r.Lstat(rel)
	into := err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if err != nil && !errdefs.IsNotFound(err) {
		return res, err
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return res, nil
		}
		if err != nil {
			return res, fmt.Errorf("read tar stream: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		target, err := targetPath(rel, hdr.Name, into)
		if err != nil {
			return res, err
		}
		eopts, err := r.ownEntry(hdr, opts)
		if err != nil {
			return res, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		n, err := r.writeEntry(target, hdr, tr, eopts)
		if err != nil {
			return res, err
		}
		res.Entries++
		res.Bytes += n
	}
}

// ownEntry sets the host owner of an entry: its own ids mapped onto the host, or (without
// Chown) the sandbox's root when the root has an id map, so nothing the host writes into a
// sandbox with a user namespace is owned by an id the sandbox cannot use.
func (r *Root) ownEntry(hdr *tar.Header, opts ExtractOptions) (ExtractOptions, error) {
	if r.ids.Size == 0 {
		return opts, nil
	}
	if !opts.Chown {
		hdr.Uid, hdr.Gid = 0, 0
	}
	uid, gid, err := r.mapHeader(hdr.Uid, hdr.Gid)
	if err != nil {
		return opts, err
	}
	hdr.Uid, hdr.Gid = uid, gid
	opts.Chown = true
	return opts, nil
}

// targetPath maps a tar entry name to a path beneath the root.
func targetPath(dest, name string, into bool) (string, error) {
	clean, err := CleanPath(name)
	if err != nil || clean == "" || strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("tar entry %q is not a relative path inside the archive: %w", name, errdefs.ErrInvalidArgument)
	}
	if into {
		return path.Join(dest, clean), nil
	}
	_, rest, _ := strings.Cut(clean, "/")
	return path.Join(dest, rest), nil
}

func (r *Root) writeEntry(rel string, hdr *tar.Header, body io.Reader, opts ExtractOptions) (int64, error) {
	if rel == "" {
		return 0, fmt.Errorf("tar entry %q would replace the root: %w", hdr.Name, errdefs.ErrInvalidArgument)
	}
	pfd, base, err := r.openParent(rel)
	if err != nil {
		return 0, err
	}
	defer unix.Close(pfd)
	mode := uint32(os.FileMode(hdr.Mode).Perm()) | uint32(hdr.Mode)&(unix.S_ISUID|unix.S_ISGID|unix.S_ISVTX)
	var n int64
	var f *os.File
	switch hdr.Typeflag {
	case tar.TypeDir:
		f, err = mkdirAt(pfd, base, mode)
	case tar.TypeReg:
		f, n, err = writeFileAt(pfd, base, mode, body)
	case tar.TypeSymlink:
		err = symlinkAt(pfd, base, hdr, opts)
	default:
		return 0, fmt.Errorf("tar entry %q has unsupported type %q: %w", hdr.Name, hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
	if err == nil && f != nil {
		err = applyMeta(f, hdr, mode, opts)
		f.Close()
	}
	if err != nil {
		return n, fmt.Errorf("write /%s: %w", rel, err)
	}
	return n, nil
}

// mkdirAt makes (or reuses) the directory base of pfd and returns it opened, never through a
// symlink.
func mkdirAt(pfd int, base string, mode uint32) (*os.File, error) {
	err := unix.Mkdirat(pfd, base, mode)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err = unix.Unlinkat(pfd, base, 0); err == nil {
				err = unix.Mkdirat(pfd, base, mode)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := checkFS(fd, base); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), base), nil
}

// symlinkAt replaces base of pfd with a symlink and chowns the link it made: through an
// O_PATH fd checked to be a symlink, never by name (a name may be swapped meanwhile).
func symlinkAt(pfd int, base string, hdr *tar.Header, opts ExtractOptions) error {
	if err := removeNonDir(pfd, base); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil || !opts.Chown {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := checkType(fd, base, unix.S_IFLNK); err != nil {
		return err
	}
	return unix.Fchownat(fd, "", hdr.Uid, hdr.Gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
}

// removeNonDir removes an existing non-directory entry (a symlink is removed, not followed).
func removeNonDir(pfd int, base string) error {
	err := unix.Unlinkat(pfd, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

func writeFileAt(pfd int, base string, mode uint32, body io.Reader) (*os.File, int64, error) {
	if err := removeNonDir(pfd, base); err != nil {
		return nil, 0, err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode&0o777)
	if err != nil {
		return nil, 0, err
	}
	f := os.NewFile(uintptr(fd), base)
	if err := checkType(fd, base, unix.S_IFREG); err != nil { // O_EXCL made it: belt and braces
		f.Close()
		return nil, 0, err
	}
	n, err := io.Copy(f, body)
	if err != nil {
		f.Close()
		return nil, n, err
	}
	return f, n, nil
}

// applyMeta sets owner, mode and times on the open entry (never by name).
func applyMeta(f *os.File, hdr *tar.Header, mode uint32, opts ExtractOptions) error {
	fd := int(f.Fd())
	if opts.Chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return futimens(fd, hdr.ModTime.UnixNano())
}

// futimens sets atime and mtime of an open file: utimensat(fd, NULL, ...), which x/sys/unix
// does not wrap (UtimesNanoAt always passes a path).
func futimens(fd int, nsec int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(nsec), unix.NsecToTimespec(nsec)}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("set times: %w", errno)
	}
	return nil
}
