//go:build linux

package criu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// DefaultCgroupYard is the node's CRIU cgroup yard. It is one per node, shared by every
// daemon on it, and outside any state root: a recursive removal of a directory holding a
// yard would walk into the cgroup hierarchies and remove every empty cgroup of the node.
const DefaultCgroupYard = "/run/deltabox/criu-cgyard"

// PrepareCgroupYard makes dir CRIU's cgroup yard (CRIU's --cgroup-yard, Options.CgroupYard):
// one directory per cgroup hierarchy of this node, named as CRIU names it (the hierarchy's
// controllers joined with ",", "name=" taken off, "unified" for cgroup2), each a bind mount of
// the hierarchy's root. It returns the hierarchies the yard holds.
//
// Without a yard CRIU mounts every hierarchy afresh for each dump and restore, and a fresh
// cgroup2 mount in the initial cgroup namespace sets the node's cgroup2 flags to the mount's
// options, that is to none: each CRIU run took favordynmods (pool.FavorDynMods) off the node,
// and nsdelegate and memory_recursiveprot off a systemd host, for everyone. A bind mount does
// not reconfigure the hierarchy, and it saves CRIU the mounts (12 ms of a 128 ms restore here).
//
// What is right in dir already stays (another daemon's CRIU may be using it); a directory
// that is not a mount of its hierarchy's root is mounted again, and one of a hierarchy this
// node no longer has is unmounted and removed, so CRIU never takes a plain directory for a
// mounted hierarchy. Nothing is ever removed recursively. dir must be root's and out of the
// sandboxes' reach.
func PrepareCgroupYard(dir string) ([]string, error) {
	hier, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup yard: %w", err)
	}
	names, err := yardNames(hier)
	if err != nil {
		return nil, err
	}
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.FSType != "cgroup" && m.FSType != "cgroup2", false
	})
	if err != nil {
		return nil, fmt.Errorf("cgroup yard: list cgroup mounts: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cgroup yard: %w", err)
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cgroup yard: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("cgroup yard: lock: %w", err)
	}
	if err := dropStale(dir, names); err != nil {
		return nil, err
	}
	var bound []string
	for _, h := range names {
		src := hierarchyRoot(mounts, h)
		if src == "" {
			// CRIU mounts a hierarchy the yard lacks itself, into the yard; for cgroup v1
			// that reconfigures nothing of the node's.
			continue
		}
		if err := bindYard(src, filepath.Join(dir, h.dir)); err != nil {
			return bound, err
		}
		bound = append(bound, h.dir)
	}
	if !slices.Contains(bound, "unified") && slices.ContainsFunc(names, func(h yardHierarchy) bool { return h.dir == "unified" }) {
		return bound, fmt.Errorf("cgroup yard: the cgroup2 hierarchy is not mounted with its root anywhere on this node: %w", errdefs.ErrFailedPrecondition)
	}
	return bound, nil
}

// bindYard makes dst a bind mount of src unless it is one already (the same directory: device
// and inode).
func bindYard(src, dst string) error {
	var want, have unix.Stat_t
	if err := unix.Stat(src, &want); err != nil {
		return fmt.Errorf("cgroup yard: %w", err)
	}
	mounted, err := mountinfo.Mounted(dst)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup yard: %w", err)
	}
	if mounted {
		if err := unix.Lstat(dst, &have); err == nil && have.Dev == want.Dev && have.Ino == want.Ino {
			return nil
		}
		if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("cgroup yard: unmount %s: %w", dst, err)
		}
	}
	if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("cgroup yard: %w", err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("cgroup yard: bind %s on %s: %w", src, dst, err)
	}
	return nil
}

// yardHierarchy is a hierarchy of /proc/self/cgroup: its controllers as the kernel lists
// them and the yard directory CRIU looks for.
type yardHierarchy struct {
	controllers []string // "" alone for cgroup2
	dir         string
}

// yardNames parses /proc/self/cgroup ("ID:controllers:path" per line) into the yard's
// directories, named as CRIU's restore names them (criu/cgroup.c ctrl_dir_and_opt) and its
// dump opens them.
func yardNames(procCgroup []byte) ([]yardHierarchy, error) {
	var out []yardHierarchy
	sc := bufio.NewScanner(bytes.NewReader(procCgroup))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("cgroup yard: bad /proc/self/cgroup line %q: %w", line, errdefs.ErrInvalidArgument)
		}
		ctrls := strings.Split(parts[1], ",")
		dirs := make([]string, 0, len(ctrls))
		for _, c := range ctrls {
			c = strings.TrimPrefix(c, "name=")
			if c == "" {
				c = "unified"
			}
			if strings.ContainsAny(c, "/") || c == "." || c == ".." {
				return nil, fmt.Errorf("cgroup yard: bad controller %q: %w", c, errdefs.ErrInvalidArgument)
			}
			dirs = append(dirs, c)
		}
		out = append(out, yardHierarchy{controllers: ctrls, dir: strings.Join(dirs, ",")})
	}
	return out, sc.Err()
}

// hierarchyRoot returns a mount point of h's hierarchy whose root is the hierarchy's root,
// or "". A controller (or a name=) belongs to one hierarchy, so a v1 mount whose super
// options hold h's first one mounts h.
func hierarchyRoot(mounts []*mountinfo.Info, h yardHierarchy) string {
	for _, m := range mounts {
		if m.Root != "/" {
			continue
		}
		if h.dir == "unified" && len(h.controllers) == 1 && h.controllers[0] == "" {
			if m.FSType == "cgroup2" {
				return m.Mountpoint
			}
			continue
		}
		if m.FSType == "cgroup" && slices.Contains(strings.Split(m.VFSOptions, ","), h.controllers[0]) {
			return m.Mountpoint
		}
	}
	return ""
}

// dropStale unmounts and removes the entries of dir that are no hierarchy of names. A
// directory that is neither empty nor a mount stays, and is reported: the yard is the daemon's.
func dropStale(dir string, names []yardHierarchy) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("cgroup yard: %w", err)
	}
	for _, e := range entries {
		if slices.ContainsFunc(names, func(h yardHierarchy) bool { return h.dir == e.Name() }) {
			continue
		}
		if err := unmountYardEntry(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// unmountYardEntry unmounts p if it is a mount and removes it (never recursively).
func unmountYardEntry(p string) error {
	if mounted, _ := mountinfo.Mounted(p); mounted {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("cgroup yard: unmount %s: %w", p, err)
		}
	}
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("cgroup yard: remove %s: %w", p, err)
	}
	return nil
}
