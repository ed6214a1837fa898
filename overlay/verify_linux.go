//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// VerifyOption configures Verify.
type VerifyOption func(*verifyOptions)

type verifyOptions struct {
	skip  []string
	mtime bool
}

// idShift maps the lower layers' owners onto the host ids the merged tree shows them with (a
// sandbox in a user namespace sees its image through idmapped mounts).
type idShift struct{ host, size uint32 }

func (m idShift) apply(e *Entry) {
	if m.size == 0 {
		return
	}
	if e.UID < m.size {
		e.UID += m.host
	}
	if e.GID < m.size {
		e.GID += m.host
	}
}

// DefaultVerifySkip returns the merged-tree paths Verify skips unless told otherwise: the
// sandbox runtime's bind mounts (.deltabox) and the kernel's pseudo filesystems.
func DefaultVerifySkip() []string { return []string{".deltabox", "proc", "sys", "dev"} }

// VerifySkip replaces the list of skipped paths (relative to the merged root, at any depth;
// the subtree under each is skipped on both sides).
func VerifySkip(paths ...string) VerifyOption {
	return func(o *verifyOptions) { o.skip = append([]string(nil), paths...) }
}

// VerifyMtimes also compares modification times (directories included).
func VerifyMtimes() VerifyOption { return func(o *verifyOptions) { o.mtime = true } }

// Verify compares what the merged tree looked like at checkpoint id (its upper state over its
// lower dirs) with a full walk of the merged tree at merged (for a running sandbox
// /proc/<init pid>/root) and returns every difference, path by path, sorted by path. Nothing
// is written and no symlink is followed. Skipped: the paths of the skip list
// (DefaultVerifySkip) and every mount point below merged (a directory on another device, or
// any entry statx flags as a mount root), on both sides. Right after a capture or a rollback
// to id, with nothing changed since, it returns nothing. File contents are compared in full,
// so the cost grows with the size of the tree; the store is locked meanwhile.
func (s *Store) Verify(ctx context.Context, id string, merged string, opts ...VerifyOption) ([]Mismatch, error) {
	o := verifyOptions{skip: DefaultVerifySkip()}
	for _, opt := range opts {
		opt(&o)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out, err := s.verify(ctx, id, merged, o)
	if err != nil {
		return nil, fmt.Errorf("verify %s against %s: %w", id, merged, err)
	}
	log.L(ctx).Debug("overlay checkpoint verified", "checkpoint", id, "mismatches", len(out))
	return out, nil
}

func (s *Store) verify(ctx context.Context, id, merged string, o verifyOptions) ([]Mismatch, error) {
	pos, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	skip, err := skipSet(o.skip)
	if err != nil {
		return nil, err
	}
	v, err := newView(s.stateAt(pos), s.chain[pos].Lower)
	if err != nil {
		return nil, err
	}
	defer v.close()
	v.ids = s.opts.ids
	rootfd, err := unix.Open(merged, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open merged root: %w", err)
	}
	defer unix.Close(rootfd)
	var st unix.Stat_t
	if err := unix.Fstat(rootfd, &st); err != nil {
		return nil, fmt.Errorf("stat merged root: %w", err)
	}
	vw := &verifier{ctx: ctx, s: s, v: v, skip: skip, dev: st.Dev, mtime: o.mtime, links: map[string][]linkSeen{}}
	if err := vw.root(rootfd, &st, s.foldRoot(pos)); err != nil {
		return nil, err
	}
	if err := vw.dir("", rootfd, true); err != nil {
		return nil, err
	}
	vw.checkLinks()
	sort.SliceStable(vw.out, func(i, j int) bool { return pathLess(vw.out[i].Path, vw.out[j].Path) })
	return vw.out, nil
}

// skipSet validates and normalizes the skip list.
func skipSet(paths []string) (map[string]bool, error) {
	set := map[string]bool{}
	for _, p := range paths {
		c, err := cleanRel(strings.TrimSuffix(path.Clean(p), "/"))
		if err != nil {
			return nil, fmt.Errorf("skip path: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		set[c] = true
	}
	return set, nil
}

// verifier is one Verify walk: the recorded view on one side, the merged tree on the other.
type verifier struct {
	ctx   context.Context
	s     *Store
	v     *view
	skip  map[string]bool
	dev   uint64
	mtime bool
	links map[string][]linkSeen // recorded hard-link group -> paths found and their inodes
	out   []Mismatch
	bufA  []byte // content comparison buffers, reused
	bufB  []byte
}

type linkSeen struct {
	path string
	ino  uint64
}

// root compares the merged root's own metadata with the checkpoint's record of it (path ".";
// checkpoints of versions that did not record it are not compared).
func (vw *verifier) root(fd int, st *unix.Stat_t, want *Entry) error {
	if want == nil {
		return nil
	}
	got, err := describeRoot(fd, st)
	if err != nil {
		return err
	}
	vw.attrs(".", want, got)
	return nil
}

func (vw *verifier) add(p, what, want, got string) {
	vw.out = append(vw.out, Mismatch{Path: p, What: what, Want: want, Got: got})
}

// dir compares the children of directory rel: fd is the merged directory (-1 when the tree
// has no directory there) and wantDir says whether the checkpoint has one.
func (vw *verifier) dir(rel string, fd int, wantDir bool) error {
	if err := vw.ctx.Err(); err != nil {
		return err
	}
	names, err := vw.childNames(rel, fd, wantDir)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := joinPath(rel, n)
		if vw.skip[p] {
			continue
		}
		if err := vw.entry(p, fd, n, wantDir); err != nil {
			return err
		}
	}
	return nil
}

// childNames returns the union of both sides' names under rel, sorted.
func (vw *verifier) childNames(rel string, fd int, wantDir bool) ([]string, error) {
	var names []string
	if wantDir {
		w, err := vw.v.childNames(rel)
		if err != nil {
			return nil, err
		}
		names = append(names, w...)
	}
	if fd >= 0 {
		g, err := readDirNames(fd)
		if err != nil {
			return nil, fmt.Errorf("read merged dir %q: %w", rel, err)
		}
		names = append(names, g...)
	}
	sort.Strings(names)
	return compactStrings(names), nil
}

func compactStrings(s []string) []string {
	out := s[:0]
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

// entry compares one path and descends into it when either side is a directory.
func (vw *verifier) entry(p string, dirfd int, name string, wantDir bool) error {
	var want, got *Entry
	var err error
	if wantDir {
		if want, err = vw.v.lookup(p); err != nil {
			return err
		}
	}
	var id fileID
	if dirfd >= 0 {
		var mount bool
		if got, id, mount, err = vw.stat(dirfd, name, p); err != nil || mount {
			return err
		}
	}
	if err := vw.compare(p, want, got, dirfd, name, id); err != nil {
		return err
	}
	wd, gd := want != nil && want.Kind == KindDir, got != nil && got.Kind == KindDir
	if !wd && !gd {
		return nil
	}
	sub := -1
	if gd {
		sub, err = openDirExpected(dirfd, name, id)
		if errors.Is(err, errReplaced) {
			vw.add(p, "type", string(KindDir), "changed during verify")
			return nil
		}
		if err != nil {
			return fmt.Errorf("open merged dir %q: %w", p, err)
		}
		defer unix.Close(sub)
	}
	return vw.dir(p, sub, wd)
}

// stat describes name in the merged directory dirfd (nil when absent). mount reports a mount
// point: a directory on another device than the root, or any entry that is a mount root.
func (vw *verifier) stat(dirfd int, name, p string) (e *Entry, id fileID, mount bool, err error) {
	var stx unix.Statx_t
	err = unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_BASIC_STATS, &stx)
	if errors.Is(err, unix.ENOENT) {
		return nil, fileID{}, false, nil
	}
	if err != nil {
		return nil, fileID{}, false, fmt.Errorf("stat merged %q: %w", p, err)
	}
	st := statFromStatx(&stx)
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return nil, fileID{}, true, nil
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Dev != vw.dev {
		return nil, fileID{}, true, nil
	}
	e, err = describe(dirfd, p, st)
	if err != nil {
		return nil, fileID{}, false, fmt.Errorf("merged: %w", err)
	}
	return e, fileID{mode: st.Mode, dev: st.Dev, ino: st.Ino}, false, nil
}

// statFromStatx converts the basic fields of a statx result.
func statFromStatx(x *unix.Statx_t) *unix.Stat_t {
	return &unix.Stat_t{
		Dev:   unix.Mkdev(x.Dev_major, x.Dev_minor),
		Ino:   x.Ino,
		Nlink: uint64(x.Nlink),
		Mode:  uint32(x.Mode),
		Uid:   x.Uid,
		Gid:   x.Gid,
		Rdev:  unix.Mkdev(x.Rdev_major, x.Rdev_minor),
		Size:  int64(x.Size),
		Mtim:  unix.Timespec{Sec: x.Mtime.Sec, Nsec: int64(x.Mtime.Nsec)},
		Ctim:  unix.Timespec{Sec: x.Ctime.Sec, Nsec: int64(x.Ctime.Nsec)},
	}
}

// Scrub reads every stored checkpoint's contents and returns each one whose digest no longer
// matches (checkpoint and path), plus the checkpoints set aside as damaged when the store was
// opened. Checkpoints of packs written before digests existed are not checked. The store is
// locked meanwhile; the cost is one read of every pack.
func (s *Store) Scrub(ctx context.Context) ([]Damage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]Damage(nil), s.damaged...)
	for _, m := range s.chain {
		f := s.packs[m.ID]
		for _, e := range m.Entries {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if !e.summed || e.ckpt != m.ID || f == nil {
				continue
			}
			err := checkContent(f, e)
			var damage *DamageError
			switch {
			case errors.As(err, &damage):
				out = append(out, Damage{Checkpoint: damage.Checkpoint, Path: damage.Path, Reason: damage.Reason})
			case errors.Is(err, errdefs.ErrDataLoss):
				out = append(out, Damage{Checkpoint: m.ID, Path: e.Path, Reason: err.Error()})
			case err != nil:
				return nil, fmt.Errorf("scrub checkpoint %s: %w", m.ID, err)
			}
		}
	}
	if len(out) > 0 {
		log.L(ctx).Warn("overlay checkpoints damaged", "dir", s.dir, "damaged", len(out))
	}
	return out, nil
}
