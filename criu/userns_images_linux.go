//go:build linux

package criu

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	usernsimg "github.com/checkpoint-restore/go-criu/v7/crit/images/userns"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

// A container in a user namespace of its own (runc makes it from the spec's mappings) is
// dumped with it: CRIU writes the namespace's uid and gid maps to userns-<id>.img and, at
// restore, makes a new user namespace with the maps of that image, not with the target
// container's. The maps decide which host ids the restored processes run as, so they are
// checked against the target's spec before CRIU runs (CheckUserNS): a snapshot taken in
// another sandbox's id range is first moved into the target's (RemapUserNS), and a forged
// image (a wider map, host root, or no user namespace at all where the target has one, which
// CRIU would restore in the host's user namespace) is refused.

// maxUserNSImage bounds a userns image read.
const maxUserNSImage = 64 << 10

// userNSImages returns the userns-*.img files of an images directory.
func userNSImages(dir string) ([]string, error) {
	return filepath.Glob(filepath.Join(dir, "userns-*.img"))
}

// readUserNS decodes one userns image: exactly one UsernsEntry (imageEntry).
func readUserNS(path string) (*usernsimg.UsernsEntry, error) {
	entry, rest, err := imageEntry(path, "USERNS", maxUserNSImage)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("criu image %s: not exactly one entry: %w", filepath.Base(path), errdefs.ErrInvalidArgument)
	}
	var e usernsimg.UsernsEntry
	if err := proto.Unmarshal(entry, &e); err != nil {
		return nil, fmt.Errorf("criu image %s: %v: %w", filepath.Base(path), err, errdefs.ErrInvalidArgument)
	}
	return &e, nil
}

// writeUserNS replaces the image at path with e, atomically.
func writeUserNS(path string, e *usernsimg.UsernsEntry) error {
	body, err := proto.Marshal(e)
	if err != nil {
		return err
	}
	m := magic.LoadMagic()
	out := make([]byte, 12, 12+len(body))
	binary.LittleEndian.PutUint32(out, uint32(m.ByName["IMG_COMMON"]))
	binary.LittleEndian.PutUint32(out[4:], uint32(m.ByName["USERNS"]))
	binary.LittleEndian.PutUint32(out[8:], uint32(len(body)))
	out = append(out, body...)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// SpecMapping returns the single uid mapping of a spec's user namespace, nil without one.
// A user namespace whose uid and gid maps are not one identical extent is refused: DeltaBox
// makes no other.
func SpecMapping(spec *specs.Spec) (*specs.LinuxIDMapping, error) {
	if spec == nil || spec.Linux == nil {
		return nil, nil
	}
	userns := false
	for _, ns := range spec.Linux.Namespaces {
		userns = userns || ns.Type == specs.UserNamespace
	}
	if !userns {
		return nil, nil
	}
	if len(spec.Linux.UIDMappings) != 1 || len(spec.Linux.GIDMappings) != 1 || spec.Linux.UIDMappings[0] != spec.Linux.GIDMappings[0] {
		return nil, fmt.Errorf("the container's user namespace maps uids %v and gids %v: want one identical extent: %w",
			spec.Linux.UIDMappings, spec.Linux.GIDMappings, errdefs.ErrFailedPrecondition)
	}
	m := spec.Linux.UIDMappings[0]
	return &m, nil
}

func extentsString(ext []*usernsimg.UidGidExtent) string {
	parts := make([]string, 0, len(ext))
	for _, x := range ext {
		parts = append(parts, fmt.Sprintf("%d->%d+%d", x.GetFirst(), x.GetLowerFirst(), x.GetCount()))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// sameExtent reports whether ext is exactly the one extent m.
func sameExtent(ext []*usernsimg.UidGidExtent, m specs.LinuxIDMapping) bool {
	return len(ext) == 1 && ext[0].GetFirst() == m.ContainerID && ext[0].GetLowerFirst() == m.HostID && ext[0].GetCount() == m.Size
}

// CheckUserNS refuses images whose user namespace is not exactly the one spec gives the
// container: with a user namespace in the spec the images must hold one userns image whose
// uid and gid maps are the spec's mapping; without one they must hold none. Errors are
// errdefs.ErrPermissionDenied naming both.
func CheckUserNS(dir string, spec *specs.Spec) error {
	want, err := SpecMapping(spec)
	if err != nil {
		return err
	}
	imgs, err := userNSImages(dir)
	if err != nil {
		return err
	}
	switch {
	case want == nil && len(imgs) == 0:
		return nil
	case want == nil:
		return fmt.Errorf("the images hold a user namespace (%s) and the container has none: %w", filepath.Base(imgs[0]), errdefs.ErrPermissionDenied)
	case len(imgs) == 0:
		return fmt.Errorf("the images hold no user namespace and the container runs in one (%d-%d -> host %d): CRIU would restore the processes with the host's ids: %w",
			want.ContainerID, want.ContainerID+want.Size-1, want.HostID, errdefs.ErrPermissionDenied)
	case len(imgs) > 1:
		return fmt.Errorf("the images hold %d user namespaces (nested ones are not restored): %w", len(imgs), errdefs.ErrPermissionDenied)
	}
	e, err := readUserNS(imgs[0])
	if err != nil {
		return err
	}
	if !sameExtent(e.GetUidMap(), *want) || !sameExtent(e.GetGidMap(), *want) {
		return fmt.Errorf("the images' user namespace maps uids %s and gids %s, the container's maps %d->%d+%d: %w",
			extentsString(e.GetUidMap()), extentsString(e.GetGidMap()), want.ContainerID, want.HostID, want.Size, errdefs.ErrPermissionDenied)
	}
	return nil
}

// RemapUserNS moves the user namespace of images dumped in one id range into another: the
// one extent of its uid and gid maps (ids from..from+size-1 onto some host range) is pointed
// at to.HostID. Anything but one extent of to.Size ids from to.ContainerID is refused
// (ErrPermissionDenied), so a forged image cannot widen the map. Images without a user
// namespace are left alone (CheckUserNS decides about them).
func RemapUserNS(dir string, to specs.LinuxIDMapping) error {
	imgs, err := userNSImages(dir)
	if err != nil || len(imgs) == 0 {
		return err
	}
	if len(imgs) > 1 {
		return fmt.Errorf("the images hold %d user namespaces (nested ones are not restored): %w", len(imgs), errdefs.ErrPermissionDenied)
	}
	e, err := readUserNS(imgs[0])
	if err != nil {
		return err
	}
	for _, ext := range [][]*usernsimg.UidGidExtent{e.GetUidMap(), e.GetGidMap()} {
		if len(ext) != 1 || ext[0].GetFirst() != to.ContainerID || ext[0].GetCount() != to.Size {
			return fmt.Errorf("the images' user namespace maps %s: want one extent of %d ids from %d: %w",
				extentsString(ext), to.Size, to.ContainerID, errdefs.ErrPermissionDenied)
		}
		host := to.HostID
		ext[0].LowerFirst = &host
	}
	return writeUserNS(imgs[0], e)
}

// ShareImages lets the restore of a container in a user namespace read its images: CRIU
// opens them from inside the user namespace it made, where host root's files are nobody's
// and only their group and other permission bits count. The images directory becomes 0755
// and its files 0644, owners unchanged (hard-linked images of concurrent forks share the
// inodes; an owner per fork would race). CRIU reaches the directory through a descriptor
// runc opened, so its parent stays closed to others (0700), which keeps the images, memory
// included, from other host users. Nothing happens without a mapping.
func ShareImages(dir string, m *specs.LinuxIDMapping) error {
	if m == nil {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return fmt.Errorf("images %s: %s is a symlink: %w", dir, path, errdefs.ErrInvalidArgument)
		}
		mode := os.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(path, mode)
	})
}

// LinkImages makes dst (new, 0700) an images directory holding src's files as hard links:
// a restore of its own (RemapUserNS replaces the userns image by a new file, so src's stays
// as it was), without copying the pages. Anything but regular files is refused.
func LinkImages(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("images %s: %s is not a regular file: %w", src, e.Name(), errdefs.ErrInvalidArgument)
		}
		if err := os.Link(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
