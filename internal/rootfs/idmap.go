package rootfs

import (
	"fmt"

	"github.com/containerd/errdefs"
)

// IDMap maps the uids and gids a sandbox sees (0..Size-1, its user namespace) onto host ids
// HostID..HostID+Size-1; uids and gids use the same map. The zero IDMap maps nothing: ids in
// the tree are the sandbox's own (no user namespace).
type IDMap struct {
	HostID uint32
	Size   uint32
}

// overflowID is what the kernel shows for a host id with no mapping in a user namespace.
const overflowID = 65534

// ToHost returns the host id of the sandbox's id; an id outside the map is InvalidArgument.
func (m IDMap) ToHost(id int) (int, error) {
	if m.Size == 0 {
		return id, nil
	}
	if id < 0 || uint64(id) >= uint64(m.Size) {
		return 0, fmt.Errorf("id %d has no mapping in the sandbox's user namespace (0-%d): %w", id, m.Size-1, errdefs.ErrInvalidArgument)
	}
	return int(m.HostID) + id, nil
}

// FromHost returns the id the sandbox sees for host id id: the overflow id (65534, nobody)
// when it has no mapping, as the kernel shows it inside.
func (m IDMap) FromHost(id uint32) int {
	if m.Size == 0 {
		return int(id)
	}
	if id < m.HostID || id-m.HostID >= m.Size {
		return overflowID
	}
	return int(id - m.HostID)
}

// Option tunes Open.
type Option func(*Root)

// WithIDMap makes the Root translate owners: Archive writes the sandbox's ids, Extract maps
// the entries' ids onto the host (and owns what it writes by the sandbox's root when it does
// not chown).
func WithIDMap(m IDMap) Option { return func(r *Root) { r.ids = m } }

// mapHeader turns a tar entry's owner into the host ids to chown to.
func (r *Root) mapHeader(uid, gid int) (int, int, error) {
	hu, err := r.ids.ToHost(uid)
	if err != nil {
		return 0, 0, fmt.Errorf("owner: %w", err)
	}
	hg, err := r.ids.ToHost(gid)
	if err != nil {
		return 0, 0, fmt.Errorf("group: %w", err)
	}
	return hu, hg, nil
}
