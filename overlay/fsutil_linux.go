//go:build linux

package overlay

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resolveFlags confine a lookup to the given root and refuse every symlink on the way, so a
// path the sandbox controls can never lead outside it (or anywhere else than the real
// directory tree).
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openRoot opens dir as the root of later openBeneath lookups.
func openRoot(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", dir, err)
	}
	return fd, nil
}

// openBeneath opens rel (relative, slash separated; "" is the root itself) under rootfd without
// following any symlink. A trailing symlink is returned as such only with O_PATH|O_NOFOLLOW.
func openBeneath(rootfd int, rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveFlags}
	for {
		fd, err := unix.Openat2(rootfd, rel, &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		return fd, err
	}
}

// openParent opens the directory holding rel and returns it with rel's last component.
func openParent(rootfd int, rel string) (int, string, error) {
	dir, name := splitPath(rel)
	fd, err := openBeneath(rootfd, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", err
	}
	return fd, name, nil
}

// procPath names entry name in the directory fd without resolving name itself; use it only
// with l* (no-follow) calls.
func procPath(fd int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name
}

// splitPath splits a relative path into its parent ("" for the root) and last component.
func splitPath(rel string) (string, string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

// parentOf returns the parent of rel, "" for top-level entries.
func parentOf(rel string) string {
	dir, _ := splitPath(rel)
	return dir
}

// joinPath joins a relative directory and a name.
func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// cleanRel validates and normalizes a relative path taken from a manifest or a caller.
func cleanRel(p string) (string, error) {
	c := path.Clean("/" + p)[1:]
	if c == "" || c != strings.TrimPrefix(p, "/") || strings.HasPrefix(c, "../") || c == ".." {
		return "", fmt.Errorf("invalid relative path %q", p)
	}
	return c, nil
}

// depth counts the components of a relative path.
func depth(rel string) int { return strings.Count(rel, "/") + 1 }

// pathLess orders paths component-wise (parents before children, siblings by name), the
// order a sorted directory walk produces.
func pathLess(a, b string) bool {
	for {
		ai, bi := strings.IndexByte(a, '/'), strings.IndexByte(b, '/')
		ac, bc := a, b
		if ai >= 0 {
			ac = a[:ai]
		}
		if bi >= 0 {
			bc = b[:bi]
		}
		if ac != bc {
			return ac < bc
		}
		if ai < 0 || bi < 0 {
			return ai < 0 && bi >= 0
		}
		a, b = a[ai+1:], b[bi+1:]
	}
}

// kindOf maps a stat mode (and device number) to an entry kind.
func kindOf(st *unix.Stat_t) Kind {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return KindFile
	case unix.S_IFDIR:
		return KindDir
	case unix.S_IFLNK:
		return KindSymlink
	case unix.S_IFIFO:
		return KindFifo
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			return KindWhiteout
		}
		return KindChar
	case unix.S_IFBLK:
		return KindBlock
	}
	return KindSocket
}

// keyOf extracts the change-detection key from a stat result.
func keyOf(st *unix.Stat_t) Key {
	return Key{
		Ino:   st.Ino,
		Ctime: st.Ctim.Nano(),
		Mtime: st.Mtim.Nano(),
		Size:  st.Size,
		Mode:  st.Mode,
	}
}

// entryFromStat fills the stat-derived fields of an entry.
func entryFromStat(rel string, st *unix.Stat_t) *Entry {
	e := &Entry{
		Path:  rel,
		Kind:  kindOf(st),
		Mode:  st.Mode & 0o7777,
		UID:   st.Uid,
		GID:   st.Gid,
		Mtime: st.Mtim.Nano(),
	}
	switch e.Kind {
	case KindFile:
		e.Size = st.Size
	case KindChar, KindBlock:
		e.Rdev = st.Rdev
	}
	return e
}

// keptXattr says whether an xattr is part of the recorded state: user.*, trusted.* except
// overlayfs's own bookkeeping (trusted.overlay.*, whose opaque flag is recorded as
// Entry.Opaque), and file capabilities.
func keptXattr(name string) bool {
	switch {
	case strings.HasPrefix(name, "trusted.overlay."):
		return false
	case strings.HasPrefix(name, "user.overlay."):
		return false
	case strings.HasPrefix(name, "user."), strings.HasPrefix(name, "trusted."):
		return true
	}
	return name == "security.capability"
}

// readXattrsAt returns the kept xattrs of name (one component, or ".", not followed if a
// symlink) in the directory open as dirfd, and whether trusted.overlay.opaque=y is set.
func readXattrsAt(dirfd int, name string) (map[string][]byte, bool, error) {
	return readXattrsBy(xattrsAt(dirfd, name))
}

// xattrOps reads one file's xattrs: list and get are llistxattr and lgetxattr of it (a
// nil buffer asks for the size), label names it in errors.
type xattrOps struct {
	label string
	list  func(buf []byte) (int, error)
	get   func(name string, buf []byte) (int, error)
}

func pathXattrs(p string) xattrOps {
	return xattrOps{label: p,
		list: func(buf []byte) (int, error) { return unix.Llistxattr(p, buf) },
		get:  func(name string, buf []byte) (int, error) { return unix.Lgetxattr(p, name, buf) }}
}

// The *xattrat system calls (Linux 6.13) take a directory fd and a name, as fstatat does:
// the other way to name a file by fd, a /proc/self/fd/N/name path, costs a path walk
// through procfs (most of a tracked scan's time per changed file). Numbers are those of the
// unified table, the same on every architecture; x/sys/unix has no wrappers yet.
const (
	sysGetxattrat  = 464
	sysListxattrat = 465
)

// noXattrAt is set once the kernel refused listxattrat (ENOSYS): procfs paths from then on.
var noXattrAt atomic.Bool

// xattrsAt reads the xattrs of name in dirfd with the *xattrat calls, or through its procfs
// path once the kernel refused them.
func xattrsAt(dirfd int, name string) xattrOps {
	p := procPath(dirfd, name)
	if noXattrAt.Load() {
		return pathXattrs(p)
	}
	return xattrOps{label: p,
		list: func(buf []byte) (int, error) {
			n, err := listxattrat(dirfd, name, buf)
			if err == unix.ENOSYS {
				noXattrAt.Store(true)
				return unix.Llistxattr(p, buf)
			}
			return n, err
		},
		get: func(attr string, buf []byte) (int, error) {
			n, err := getxattrat(dirfd, name, attr, buf)
			if err == unix.ENOSYS {
				noXattrAt.Store(true)
				return unix.Lgetxattr(p, attr, buf)
			}
			return n, err
		}}
}

func listxattrat(dirfd int, name string, buf []byte) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	var bp unsafe.Pointer
	if len(buf) > 0 {
		bp = unsafe.Pointer(&buf[0])
	}
	r, _, e := unix.Syscall6(sysListxattrat, uintptr(dirfd), uintptr(unsafe.Pointer(p)), unix.AT_SYMLINK_NOFOLLOW,
		uintptr(bp), uintptr(len(buf)), 0)
	runtime.KeepAlive(p)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// xattrArgs is the kernel's struct xattr_args.
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

func getxattrat(dirfd int, name, attr string, buf []byte) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	args := xattrArgs{size: uint32(len(buf))}
	if len(buf) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	r, _, e := unix.Syscall6(sysGetxattrat, uintptr(dirfd), uintptr(unsafe.Pointer(p)), unix.AT_SYMLINK_NOFOLLOW,
		uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	runtime.KeepAlive(p)
	runtime.KeepAlive(a)
	runtime.KeepAlive(buf)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// readXattrsBy is readXattrsAt through o.
func readXattrsBy(o xattrOps) (map[string][]byte, bool, error) {
	names, err := listXattrsBy(o)
	if err != nil {
		return nil, false, err
	}
	var out map[string][]byte
	opaque := false
	for _, n := range names {
		if n != "trusted.overlay.opaque" && !keptXattr(n) {
			continue
		}
		v, err := getXattrBy(o, n)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("getxattr %s %s: %w", o.label, n, err)
		}
		if n == "trusted.overlay.opaque" {
			opaque = string(v) == "y"
			continue
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[n] = v
	}
	return out, opaque, nil
}

// listXattrs lists the xattr names of p without following a final symlink.
func listXattrs(p string) ([]string, error) { return listXattrsBy(pathXattrs(p)) }

func listXattrsBy(o xattrOps) ([]string, error) {
	buf := make([]byte, 256)
	for {
		n, err := o.list(buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := o.list(nil)
			if err != nil {
				return nil, fmt.Errorf("listxattr %s: %w", o.label, err)
			}
			buf = make([]byte, sz+64)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listxattr %s: %w", o.label, err)
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names, nil
	}
}

// getXattr reads the xattr name of p without following a final symlink.
func getXattr(p, name string) ([]byte, error) { return getXattrBy(pathXattrs(p), name) }

// getXattrAt is getXattr of file (one component) in the directory open as dirfd.
func getXattrAt(dirfd int, file, name string) ([]byte, error) {
	return getXattrBy(xattrsAt(dirfd, file), name)
}

// getXattrBy reads one xattr through o.
func getXattrBy(o xattrOps, name string) ([]byte, error) {
	buf := make([]byte, 128)
	for {
		n, err := o.get(name, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := o.get(name, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+16)
			continue
		}
		if err != nil {
			return nil, err
		}
		return append([]byte(nil), buf[:n]...), nil
	}
}

// readLinkAt reads the target of the symlink name in dirfd.
func readLinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, len(buf)*4)
	}
}

// readDirNames lists the names in the directory open as fd (not sorted).
func readDirNames(fd int) ([]string, error) {
	buf := make([]byte, 32<<10)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// isNotExist reports errors meaning "there is no such entry (as a real path)".
func isNotExist(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}
