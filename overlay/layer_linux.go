//go:build linux

package overlay

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Export writes checkpoint id as an OCI layer tar: the full upper state at that checkpoint
// relative to the image (its lower dirs), deletions as .wh.NAME and opaque directories as
// .wh..wh..opq. The state is materialized in a scratch upper dir inside the store and
// turned into a tar by containerd's overlay-aware differ and change writer; xattrs (user.*,
// trusted.*) ride along as PAX SCHILY.xattr records and mtimes keep their nanoseconds as PAX
// mtime records (containerd's writer truncates them to seconds; they are put back from the
// checkpoint's record).
func (s *Store) Export(ctx context.Context, id string, w io.Writer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.export(ctx, id, w); err != nil {
		return fmt.Errorf("export checkpoint %s: %w", id, err)
	}
	return nil
}

func (s *Store) export(ctx context.Context, id string, w io.Writer) error {
	pos, err := s.lookup(id)
	if err != nil {
		return err
	}
	state, err := s.fullState(pos) // the folded layer is part of the sandbox's files
	if err != nil {
		return err
	}
	lowers := s.exportLowers(s.chain[pos].Lower)
	if s.opts.fold != "" {
		if state, err = hidingOnly(state, lowers); err != nil {
			return err
		}
	}
	tmp, err := os.MkdirTemp(s.dir, ".export-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	upper := filepath.Join(tmp, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		return err
	}
	if err := s.materialize(state, upper); err != nil {
		return err
	}
	base, release, err := lowerBase(tmp, lowers)
	if err != nil {
		return err
	}
	defer release()
	return writeLayer(ctx, w, base, upper, state, s.opts.ids)
}

// hidingOnly drops the whiteouts of state that hide nothing of the lower layers (a folded
// layer's file the sandbox deleted): in a tar they would be added as character devices.
func hidingOnly(state map[string]*Entry, lowers []string) (map[string]*Entry, error) {
	v, err := newView(map[string]*Entry{}, lowers)
	if err != nil {
		return nil, err
	}
	defer v.close()
	out := make(map[string]*Entry, len(state))
	for p, e := range state {
		if e.Kind == KindWhiteout {
			below, err := v.lookup(p)
			if err != nil {
				return nil, err
			}
			if below == nil {
				continue
			}
		}
		out[p] = e
	}
	return out, nil
}

// materialize writes an upper state into an empty directory in overlay format.
func (s *Store) materialize(state map[string]*Entry, dir string) error {
	pl := &plan{touched: map[string]bool{}, srcs: map[string]source{}, rawUpper: true}
	for _, e := range state {
		pl.items = append(pl.items, &planned{e: e})
		if e.Kind == KindDir {
			pl.dirTimes = append(pl.dirTimes, e)
		}
	}
	if err := pl.prepare(s, nil); err != nil {
		return err
	}
	rootfd, err := openRoot(dir)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	return pl.apply(rootfd)
}

// lowerBase returns one directory showing the merged lower layers: the layer itself when
// there is one, an empty directory when there is none, else a read-only overlay of them
// (mounted under tmp; release unmounts it).
func lowerBase(tmp string, lowers []string) (string, func(), error) {
	switch len(lowers) {
	case 0:
		dir := filepath.Join(tmp, "empty")
		return dir, func() {}, os.Mkdir(dir, 0o755)
	case 1:
		return lowers[0], func() {}, nil
	}
	dir := filepath.Join(tmp, "lower")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, err
	}
	if err := unix.Mount("overlay", dir, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lowers, ":")); err != nil {
		return "", nil, fmt.Errorf("mount lower layers read-only: %w", err)
	}
	return dir, func() { _ = unix.Unmount(dir, unix.MNT_DETACH) }, nil
}

// writeLayer streams the tar of upper (over base) to w, adding xattrs from state. The owners
// are written as the sandbox sees them: a sandbox in a user namespace (ids, WithLowerIDs)
// has host ids in its upper dir, which are moved back by ids.host (see sandboxView).
func writeLayer(ctx context.Context, w io.Writer, base, upper string, state map[string]*Entry, ids idShift) error {
	pr, pw := io.Pipe()
	go func() {
		cw := archive.NewChangeWriter(pw, upper)
		err := fs.DiffDirChanges(ctx, base, upper, fs.DiffSourceOverlayFS, cw.HandleChange)
		if cerr := cw.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err)
	}()
	err := addXattrs(pr, w, state, ids)
	pr.CloseWithError(err)
	return err
}

// addXattrs copies a tar stream, recording each entry's kept xattrs as PAX records (the
// change writer only carries security.capability).
func addXattrs(r io.Reader, w io.Writer, state map[string]*Entry, ids idShift) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	tr, tw := tar.NewReader(r), tar.NewWriter(bw)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if e := state[strings.TrimSuffix(hdr.Name, "/")]; e != nil {
			amendHeader(hdr, e)
		}
		sandboxView(hdr, ids)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// amendHeader puts back what containerd's change writer leaves out of an entry's header: the
// sub-second part of the mtime (a PAX mtime record; the writer truncates to seconds for the
// sake of tars written without PAX, but its headers are PAX anyway) and, except on hard-link
// entries, the kept xattrs (PAX SCHILY.xattr records). A hard-link entry gets the mtime too:
// extracting it re-times the shared inode.
func amendHeader(hdr *tar.Header, e *Entry) {
	hdr.Format = tar.FormatPAX
	hdr.ModTime = time.Unix(0, e.Mtime)
	if len(e.Xattrs) == 0 || hdr.Typeflag == tar.TypeLink {
		return
	}
	if hdr.PAXRecords == nil {
		hdr.PAXRecords = map[string]string{}
	}
	keys := make([]string, 0, len(e.Xattrs))
	for k := range e.Xattrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		hdr.PAXRecords["SCHILY.xattr."+k] = string(e.Xattrs[k])
	}
}

// overflowID is the id the kernel shows for an id a user namespace does not map.
const overflowID = 65534

// sandboxView moves an entry's owners from host ids into the ids the sandbox sees (ids.host
// is its 0); an owner outside the sandbox's range becomes overflowID, as the sandbox sees
// it. A file capability (security.capability) is dropped: a namespaced one names the host
// id of its user namespace's root, which means nothing in another range.
func sandboxView(hdr *tar.Header, ids idShift) {
	if ids.size == 0 {
		return
	}
	hdr.Uid, hdr.Gid = ids.toSandbox(hdr.Uid), ids.toSandbox(hdr.Gid)
	hdr.Uname, hdr.Gname = "", ""
	delete(hdr.PAXRecords, "SCHILY.xattr.security.capability")
}

func (s idShift) toSandbox(id int) int {
	if id >= int(s.host) && id < int(s.host)+int(s.size) {
		return id - int(s.host)
	}
	return overflowID
}

// ImportOption configures Import.
type ImportOption func(*importOptions)

type importOptions struct {
	overlay bool
	ids     idShift
}

// WithIDShift makes Import write a tar holding the ids a sandbox sees (as Export writes it
// for a sandbox in a user namespace) into the upper dir of a sandbox whose user namespace maps
// ids 0..size-1 onto host ids host..: each owner is moved up by host. An owner the range does
// not hold is refused (ErrInvalidArgument) before anything is written for it, and so are file
// capabilities (they would name the wrong namespace root).
func WithIDShift(host, size uint32) ImportOption {
	return func(o *importOptions) { o.ids = idShift{host, size} }
}

// WithOverlayWhiteouts makes Import write deletions in overlayfs's format (0/0 character
// devices and trusted.overlay.opaque=y), for an upper dir; without it, deletions are applied
// to dir (a plain directory tree).
func WithOverlayWhiteouts() ImportOption { return func(o *importOptions) { o.overlay = true } }

// Import applies an OCI layer tar to dir, which must not be the upper dir of a mounted overlay.
// Entries are confined to dir: containerd's archive.Apply rejects or re-roots "..", absolute
// names and links that would escape. By containerd's policy, trusted.* xattrs in the tar are
// not applied (user.* and security.capability are).
func Import(ctx context.Context, r io.Reader, dir string, opts ...ImportOption) error {
	var o importOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkNotMountedUpper(dir); err != nil {
		return err
	}
	var aopts []archive.ApplyOpt
	if o.overlay {
		aopts = append(aopts, archive.WithConvertWhiteout(archive.OverlayConvertWhiteout))
	}
	if o.ids.size > 0 {
		aopts = append(aopts, archive.WithFilter(o.ids.toHost))
	}
	if _, err := archive.Apply(ctx, dir, r, aopts...); err != nil {
		return fmt.Errorf("import layer into %s: %w", dir, err)
	}
	return nil
}

// checkNotMountedUpper refuses a directory that a mounted overlay uses as its upper dir.
func checkNotMountedUpper(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil // best effort
	}
	if strings.Contains(string(data), "upperdir="+abs+",") || strings.Contains(string(data), "upperdir="+abs+"\n") {
		return fmt.Errorf("%s is the upper dir of a mounted overlay: %w", dir, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// toHost is Import's header filter for WithIDShift. containerd's Apply extracts with the
// header its filter was given, so the owners moved here are the ones written.
func (s idShift) toHost(hdr *tar.Header) (bool, error) {
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= int(s.size) || hdr.Gid >= int(s.size) {
		return false, fmt.Errorf("%s: owner %d:%d is outside the sandbox's %d ids: %w", hdr.Name, hdr.Uid, hdr.Gid, s.size, errdefs.ErrInvalidArgument)
	}
	if _, ok := hdr.PAXRecords["SCHILY.xattr.security.capability"]; ok {
		return false, fmt.Errorf("%s: a file capability cannot be moved into a user namespace: %w", hdr.Name, errdefs.ErrInvalidArgument)
	}
	hdr.Uid += int(s.host)
	hdr.Gid += int(s.host)
	hdr.Uname, hdr.Gname = "", ""
	return true, nil
}
