package pool

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/rootfs"
)

// Every sandbox runs in a user namespace of its own (unless its pool sets
// no_user_namespace): uids and gids 0-65535 inside are a range of host ids that no other
// sandbox of this node uses, so root in a sandbox is an unprivileged host uid, and two
// sandboxes never share a host uid. The range is in the container's spec (containerd keeps
// it), so a restarted daemon finds every sandbox's range again (reconcile).

// Host id ranges of sandboxes: IDRangeSize ids each, from IDRangeFirst on, far above the ids
// of ordinary host users and of /etc/subuid's usual ranges.
const (
	IDRangeSize  = 65536
	IDRangeFirst = 1 << 28
	idRangeSlots = 4096
)

// IDMapping maps a sandbox's uids and gids 0..Size-1 onto host ids HostID..HostID+Size-1.
type IDMapping struct {
	ContainerID uint32 `json:"container_id"`
	HostID      uint32 `json:"host_id"`
	Size        uint32 `json:"size"`
}

func (m IDMapping) String() string {
	return fmt.Sprintf("%d-%d -> host %d-%d", m.ContainerID, m.ContainerID+m.Size-1, m.HostID, m.HostID+m.Size-1)
}

// rootfsMap is the mapping as internal/rootfs takes it (the zero map for none).
func (m *IDMapping) rootfsMap() rootfs.IDMap {
	if m == nil {
		return rootfs.IDMap{}
	}
	return rootfs.IDMap{HostID: m.HostID, Size: m.Size}
}

func (m IDMapping) specMaps() []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: m.ContainerID, HostID: m.HostID, Size: m.Size}}
}

// mappingOfSpec returns the user namespace mapping of a container's spec (nil: none).
func mappingOfSpec(s *specs.Spec) *IDMapping {
	if s == nil || s.Linux == nil || len(s.Linux.UIDMappings) != 1 {
		return nil
	}
	hasUserNS := false
	for _, ns := range s.Linux.Namespaces {
		hasUserNS = hasUserNS || ns.Type == specs.UserNamespace
	}
	u := s.Linux.UIDMappings[0]
	if !hasUserNS {
		return nil
	}
	return &IDMapping{ContainerID: u.ContainerID, HostID: u.HostID, Size: u.Size}
}

// idRanges hands out host id ranges, one per sandbox, named by its holder: the sandbox's
// directory (absolute). With a registry directory the ranges are also recorded host-wide
// (idRegistry), so that another daemon on the host never hands out the same one.
type idRanges struct {
	mu   sync.Mutex
	reg  idRegistry        // dir "": this process only (unit tests)
	used map[uint32]string // range start -> holder
}

func newIDRanges(registry string) *idRanges {
	return &idRanges{reg: idRegistry{dir: registry}, used: map[uint32]string{}}
}

// locked runs f under the host-wide registry lock (and a.mu).
func (a *idRanges) locked(f func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reg.dir == "" {
		return f()
	}
	unlock, err := a.reg.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return f()
}

// allocate gives holder the lowest range free on the host.
func (a *idRanges) allocate(holder string) (IDMapping, error) {
	var m IDMapping
	err := a.locked(func() error {
		for i := range uint32(idRangeSlots) {
			start := IDRangeFirst + i*IDRangeSize
			if _, taken := a.used[start]; taken {
				continue
			}
			if a.reg.dir != "" {
				other, err := a.reg.take(start, holder)
				if err != nil {
					return err
				}
				if other != "" { // another daemon's sandbox
					continue
				}
			}
			a.used[start] = holder
			m = IDMapping{HostID: start, Size: IDRangeSize}
			return nil
		}
		return fmt.Errorf("all %d user namespace id ranges of the host are in use: %w", idRangeSlots, errdefs.ErrResourceExhausted)
	})
	return m, err
}

// claim records that holder holds m (a sandbox found at start). A range held by another
// sandbox (of this daemon or another) is refused: the two would share host ids.
func (a *idRanges) claim(holder string, m IDMapping) error {
	return a.locked(func() error {
		if other, ok := a.used[m.HostID]; ok && other != holder {
			return fmt.Errorf("host ids %s of %s are also %s's: %w", m, holder, other, errdefs.ErrFailedPrecondition)
		}
		if a.reg.dir != "" {
			other, err := a.reg.take(m.HostID, holder)
			if err != nil {
				return err
			}
			if other != "" {
				return fmt.Errorf("host ids %s of %s are also %s's (another daemon's sandbox): %w", m, holder, other, errdefs.ErrFailedPrecondition)
			}
		}
		a.used[m.HostID] = holder
		return nil
	})
}

// release frees holder's range (none is fine).
func (a *idRanges) release(holder string) {
	_ = a.locked(func() error {
		for start, c := range a.used {
			if c == holder {
				delete(a.used, start)
				if a.reg.dir != "" {
					if err := a.reg.give(start, holder); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// prune drops the registry entries of holders below dir (this daemon's sandboxes) that hold
// no range here: sandboxes gone while the daemon was down. Called after every sandbox found
// at start was claimed.
func (a *idRanges) prune(dir string) error {
	if a.reg.dir == "" {
		return nil
	}
	return a.locked(func() error {
		ents, err := a.reg.entries()
		if err != nil {
			return err
		}
		for start, holder := range ents {
			if strings.HasPrefix(holder, dir+string(filepath.Separator)) && a.used[start] != holder {
				if err := a.reg.give(start, holder); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// allocateIDs gives a new sandbox of t its host id range (none when t opts out) and hands its
// run directory (the init's socket directory) to the sandbox's root. The sandbox's directory
// becomes root:<the sandbox's root group> 0710: a CRIU restore opens the run directory, a
// bind-mount source, from inside the sandbox's user namespace, and no other sandbox or host
// user may enter it.
func (r *runtime) allocateIDs(t *Template, inst *instance) error {
	if t.NoUserNamespace {
		return nil
	}
	m, err := r.ids.allocate(r.containerDir(inst.cid))
	if err != nil {
		return err
	}
	inst.ids = &m
	if err := os.Chown(inst.runDir, int(m.HostID), int(m.HostID)); err != nil {
		return fmt.Errorf("hand the run dir to the sandbox's root: %w", err)
	}
	dir := r.containerDir(inst.cid)
	if err := os.Chown(dir, 0, int(m.HostID)); err != nil {
		return fmt.Errorf("open the sandbox directory to the sandbox's root: %w", err)
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return fmt.Errorf("open the sandbox directory to the sandbox's root: %w", err)
	}
	return nil
}

// snapshotOpts asks the snapshotter for a root filesystem owned by the sandbox's ids
// (idmapped mounts of the image's layers, no copy).
func (inst *instance) snapshotOpts() []snapshots.Opt {
	if inst.ids == nil {
		return nil
	}
	return []snapshots.Opt{containerd.WithUserNSRemapperLabels(inst.ids.specMaps(), inst.ids.specMaps())}
}

// idsOf reads a container's user namespace mapping from its spec (nil: none).
func idsOf(ctx context.Context, c containerd.Container) (*IDMapping, error) {
	spec, err := c.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("spec of %s: %w", c.ID(), err)
	}
	return mappingOfSpec(spec), nil
}

// claimIDs reserves the id range of a container found at start, so that no new sandbox gets
// it while the container exists.
func (r *runtime) claimIDs(ctx context.Context, c containerd.Container) {
	m, err := idsOf(ctx, c)
	if err == nil && m != nil {
		err = r.ids.claim(r.containerDir(c.ID()), *m)
	}
	if err != nil {
		log.L(ctx).Error("user namespace ids of a sandbox found at start", "container", c.ID(), "error", err)
	}
}
