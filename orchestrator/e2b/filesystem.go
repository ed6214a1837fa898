package e2b

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/rootfs"
)

// maxListDepth bounds ListDir's depth, maxListEntries its answer.
const (
	maxListDepth   = 16
	maxListEntries = 100000
)

// The filesystem service works on the sandbox's root from the host, through internal/rootfs:
// no path the sandbox controls is ever followed (a symlink on the way is an error, not a
// jump), which differs from envd (inside the sandbox, following links) only there.
func (g *Gateway) filesystemRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /filesystem.Filesystem/Stat", unary(g.stat, g))
	mux.HandleFunc("POST /filesystem.Filesystem/MakeDir", unary(g.makeDir, g))
	mux.HandleFunc("POST /filesystem.Filesystem/Move", unary(g.move, g))
	mux.HandleFunc("POST /filesystem.Filesystem/ListDir", unary(g.listDir, g))
	mux.HandleFunc("POST /filesystem.Filesystem/Remove", unary(g.remove, g))
	mux.HandleFunc("POST /filesystem.Filesystem/WatchDir", serverStream(g.watchDir, g))
	mux.HandleFunc("POST /filesystem.Filesystem/CreateWatcher", unary(g.createWatcher, g))
	mux.HandleFunc("POST /filesystem.Filesystem/GetWatcherEvents", unary(g.watcherEvents, g))
	mux.HandleFunc("POST /filesystem.Filesystem/RemoveWatcher", unary(g.removeWatcher, g))
}

// resolve turns an SDK path (absolute, or relative to the sandbox's workdir) into a path
// relative to the sandbox root, and the absolute path it names.
func (sb *sandbox) resolve(p string) (rel, abs string, err error) {
	if p == "" {
		return "", "", fmt.Errorf("empty path: %w", errdefs.ErrInvalidArgument)
	}
	if !path.IsAbs(p) {
		p = path.Join(sb.workdir, p)
	}
	rel, err = rootfs.CleanPath(p)
	return rel, "/" + rel, err
}

// withRoot runs fn on the sandbox's root.
func (g *Gateway) withRoot(ctx context.Context, sb *sandbox, fn func(root *rootfs.Root) error) error {
	root, err := g.b.SandboxRoot(ctx, sb.id)
	if err != nil {
		return err
	}
	defer root.Close()
	return fn(root)
}

// entry describes rel (absolute path abs) as EntryInfo.
func entry(root *rootfs.Root, rel, abs string, st *unix.Stat_t, names *idNames) entryInfo {
	mode := fileMode(st)
	e := entryInfo{Name: path.Base(abs), Path: abs, Size: strconv.FormatInt(st.Size, 10), Mode: uint32(mode.Perm()),
		Permissions: mode.String(), Owner: names.user(root.SandboxID(st.Uid)), Group: names.group(root.SandboxID(st.Gid)),
		ModifiedTime: pbTime(time.Unix(st.Mtim.Unix()))}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		e.Type = "FILE_TYPE_DIRECTORY"
	case unix.S_IFLNK:
		e.Type = "FILE_TYPE_SYMLINK"
		if t, err := root.Readlink(rel); err == nil {
			e.SymlinkTarget = &t
		}
	case unix.S_IFREG:
		e.Type = "FILE_TYPE_FILE"
	default:
		e.Type = "FILE_TYPE_UNSPECIFIED"
	}
	if abs == "/" {
		e.Name = "/"
	}
	return e
}

func fileMode(st *unix.Stat_t) fs.FileMode {
	m := fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	return m
}

// statEntry describes the entry at rel (shown as abs) without following a symlink there.
func statEntry(root *rootfs.Root, rel, abs string) (entryInfo, error) {
	st, err := root.Lstat(rel)
	if err != nil {
		return entryInfo{}, err
	}
	return entry(root, rel, abs, &st, newIDNames(root)), nil
}

func (g *Gateway) stat(ctx context.Context, sb *sandbox, req *pathRequest) (*entryResponse, error) {
	rel, abs, err := sb.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	var out entryResponse
	err = g.withRoot(ctx, sb, func(root *rootfs.Root) error {
		e, err := statEntry(root, rel, abs)
		out.Entry = e
		return err
	})
	return &out, err
}

func (g *Gateway) makeDir(ctx context.Context, sb *sandbox, req *pathRequest) (*entryResponse, error) {
	rel, abs, err := sb.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	var out entryResponse
	err = g.withRoot(ctx, sb, func(root *rootfs.Root) error {
		made, err := root.MkdirAll(rel, 0o755)
		if err != nil {
			return err
		}
		if !made {
			return fmt.Errorf("directory %s already exists: %w", abs, errdefs.ErrAlreadyExists)
		}
		e, err := statEntry(root, rel, abs)
		out.Entry = e
		return err
	})
	return &out, err
}

func (g *Gateway) move(ctx context.Context, sb *sandbox, req *moveRequest) (*entryResponse, error) {
	src, _, err := sb.resolve(req.Source)
	if err != nil {
		return nil, err
	}
	dst, dabs, err := sb.resolve(req.Destination)
	if err != nil {
		return nil, err
	}
	var out entryResponse
	err = g.withRoot(ctx, sb, func(root *rootfs.Root) error {
		if err := root.Rename(src, dst); err != nil {
			return err
		}
		e, err := statEntry(root, dst, dabs)
		out.Entry = e
		return err
	})
	return &out, err
}

func (g *Gateway) remove(ctx context.Context, sb *sandbox, req *pathRequest) (*empty, error) {
	rel, _, err := sb.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	return &empty{}, g.withRoot(ctx, sb, func(root *rootfs.Root) error { return root.RemoveAll(rel) })
}

// checkDir answers whether rel (shown as abs) is a directory, not following a symlink there.
func checkDir(root *rootfs.Root, rel, abs string) error {
	st, err := root.Lstat(rel)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory: %w", abs, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (g *Gateway) listDir(ctx context.Context, sb *sandbox, req *listDirRequest) (*listDirResponse, error) {
	rel, abs, err := sb.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	depth := int(req.Depth)
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, fmt.Errorf("depth %d is over %d: %w", depth, maxListDepth, errdefs.ErrInvalidArgument)
	}
	out := listDirResponse{Entries: []entryInfo{}}
	err = g.withRoot(ctx, sb, func(root *rootfs.Root) error {
		if err := checkDir(root, rel, abs); err != nil {
			return err
		}
		return walk(root, rel, abs, depth, newIDNames(root), &out.Entries)
	})
	return &out, err
}

// walk appends the entries of the directory rel, and of its subdirectories down to depth.
func walk(root *rootfs.Root, rel, abs string, depth int, names *idNames, out *[]entryInfo) error {
	ents, err := root.ReadDir(rel)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if len(*out) >= maxListEntries {
			return fmt.Errorf("%s holds more than %d entries (to depth): list a subdirectory: %w", abs, maxListEntries, errdefs.ErrResourceExhausted)
		}
		crel, cabs := path.Join(rel, e.Name), path.Join(abs, e.Name)
		*out = append(*out, entry(root, crel, cabs, &e.Stat, names))
		if depth > 1 && e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR {
			if err := walk(root, crel, cabs, depth-1, names, out); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// idNames maps uids and gids to names through the sandbox's /etc/passwd and /etc/group.
type idNames struct {
	users, groups map[uint32]string
}

func newIDNames(root *rootfs.Root) *idNames {
	return &idNames{users: readIDFile(root, "etc/passwd"), groups: readIDFile(root, "etc/group")}
}

// readIDFile reads name:x:id lines (at most 1 MiB) of a sandbox file.
func readIDFile(root *rootfs.Root, rel string) map[uint32]string {
	out := map[uint32]string{}
	f, _, err := root.OpenFile(rel)
	if err != nil {
		return out
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	n, _ := readFull(f, buf)
	for _, line := range splitLines(string(buf[:n])) {
		fields := splitColon(line)
		if len(fields) < 3 {
			continue
		}
		if id, err := strconv.ParseUint(fields[2], 10, 32); err == nil {
			if _, ok := out[uint32(id)]; !ok {
				out[uint32(id)] = fields[0]
			}
		}
	}
	return out
}

func (n *idNames) user(id uint32) string  { return nameOr(n.users, id) }
func (n *idNames) group(id uint32) string { return nameOr(n.groups, id) }

func nameOr(m map[uint32]string, id uint32) string {
	if s, ok := m[id]; ok {
		return s
	}
	return strconv.FormatUint(uint64(id), 10)
}

func readFull(f *os.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil || m == 0 {
			return n, err
		}
	}
	return n, nil
}
