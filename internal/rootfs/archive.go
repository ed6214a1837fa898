package rootfs

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Archive writes rel (a file, symlink or directory tree) to w as a tar stream whose entries
// are named base(rel)[/...]. Symlinks are archived as symlinks and never followed; devices,
// fifos and sockets are skipped, and never opened: every entry is opened O_PATH and checked
// to be what the walk saw before it is read (see openPath), so an entry swapped for a device
// node or a FIFO mid-copy fails the copy instead of being read.
func (r *Root) Archive(rel string, w io.Writer) error {
	if rel == "" {
		return fmt.Errorf("copying the whole root is not supported; name a directory: %w", errdefs.ErrInvalidArgument)
	}
	pfd, base, err := r.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	tw := tar.NewWriter(w)
	if err := r.archiveAt(tw, pfd, base, base); err != nil {
		return err
	}
	return tw.Close()
}

// archiveAt archives the entry name of directory dirfd under the tar name tname.
func (r *Root) archiveAt(tw *tar.Writer, dirfd int, name, tname string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", tname, err)
	}
	hdr := &tar.Header{Name: tname, Mode: int64(fileMode(&st)), Uid: r.ids.FromHost(st.Uid), Gid: r.ids.FromHost(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, err := readlinkat(dirfd, name)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return tw.WriteHeader(hdr)
	case unix.S_IFREG:
		return archiveFile(tw, dirfd, name, hdr, &st)
	case unix.S_IFDIR:
		hdr.Typeflag, hdr.Name = tar.TypeDir, tname+"/"
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		return r.archiveDir(tw, dirfd, name, tname, &st)
	}
	return nil
}

func (r *Root) archiveDir(tw *tar.Writer, dirfd int, name, tname string, want *unix.Stat_t) error {
	pfd, err := openPath(dirfd, name, want, unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", tname, err)
	}
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	unix.Close(pfd)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", tname, err)
	}
	d := os.NewFile(uintptr(fd), tname)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", tname, err)
	}
	for _, n := range names {
		if err := r.archiveAt(tw, fd, n, path.Join(tname, n)); err != nil {
			return err
		}
	}
	return nil
}

// archiveFile archives the regular file name of dirfd, which the walk saw as want.
func archiveFile(tw *tar.Writer, dirfd int, name string, hdr *tar.Header, want *unix.Stat_t) error {
	pfd, err := openPath(dirfd, name, want, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", hdr.Name, err)
	}
	fd, err := reopenFile(pfd, hdr.Name, want)
	unix.Close(pfd)
	if err != nil {
		return err
	}
	size := want.Size
	f := os.NewFile(uintptr(fd), hdr.Name)
	defer f.Close()
	hdr.Typeflag, hdr.Size = tar.TypeReg, size
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.LimitReader(f, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s shrank while being copied (%d of %d bytes)", hdr.Name, n, size)
	}
	return err
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", fmt.Errorf("readlink %s: %w", name, err)
	}
	return string(buf[:n]), nil
}
