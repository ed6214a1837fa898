package pool

import (
	"context"
	"fmt"
	"os"
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

// idRanges hands out host id ranges, one per sandbox.
type idRanges struct {
	mu   sync.Mutex
	used map[uint32]string // range start -> container ID
}

func newIDRanges() *idRanges { return &idRanges{used: map[uint32]string{}} }

// allocate gives cid the lowest free range.
func (a *idRanges) allocate(cid string) (IDMapping, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range uint32(idRangeSlots) {
		start := IDRangeFirst + i*IDRangeSize
		if _, taken := a.used[start]; !taken {
			a.used[start] = cid
			return IDMapping{HostID: start, Size: IDRangeSize}, nil
		}
	}
	return IDMapping{}, fmt.Errorf("all %d user namespace id ranges are in use: %w", idRangeSlots, errdefs.ErrResourceExhausted)
}

// claim records that cid holds m (a sandbox found at start). A range held by another
// container is refused: the two would share host ids.
func (a *idRanges) claim(cid string, m IDMapping) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if other, ok := a.used[m.HostID]; ok && other != cid {
		return fmt.Errorf("host ids %s of %s are also %s's: %w", m, cid, other, errdefs.ErrFailedPrecondition)
	}
	a.used[m.HostID] = cid
	return nil
}

// release frees cid's range (none is fine).
func (a *idRanges) release(cid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for start, c := range a.used {
		if c == cid {
			delete(a.used, start)
		}
	}
}

// allocateIDs gives a new sandbox of t its host id range (none when t opts out) and hands its
// run directory (the init's socket directory) to the sandbox's root.
func (r *runtime) allocateIDs(t *Template, inst *instance) error {
	if t.NoUserNamespace {
		return nil
	}
	m, err := r.ids.allocate(inst.cid)
	if err != nil {
		return err
	}
	inst.ids = &m
	if err := os.Chown(inst.runDir, int(m.HostID), int(m.HostID)); err != nil {
		return fmt.Errorf("hand the run dir to the sandbox's root: %w", err)
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
		err = r.ids.claim(c.ID(), *m)
	}
	if err != nil {
		log.L(ctx).Error("user namespace ids of a sandbox found at start", "container", c.ID(), "error", err)
	}
}
