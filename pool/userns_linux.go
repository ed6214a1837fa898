package pool

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/pool/network"
)

// runc makes a sandbox's user namespace (from the mapping in its spec) and, inside it, the
// network namespace, so both are the container's own: CRIU dumps them with it and recreates
// them at restore, the network namespace owned by the restored user namespace. A network
// namespace made beforehand would belong to another user namespace (the host's, or one
// pinned for it), which the restored processes could not enter (EPERM). The network is
// therefore attached after the task starts (attachNetwork): its namespace is pinned from the
// init's /proc/<pid>/ns/net while the init's pidfd shows it alive, then CNI adds the veth. A
// restore (or any new task of the container) comes up in a new network namespace, with lo down
// and without the veth, whose peer CRIU cannot recreate: reattachNetwork moves the sandbox's
// attachment there, keeping its address.
//
// Sandboxes made by an older daemon joined a user namespace pinned in their directory
// (userNSFile); the pin is dropped once their task runs, and leftovers are removed
// (unpinOrphanUserNS).

const userNSFile = "userns" // in the sandbox's directory (older daemons)

func (r *runtime) userNSPath(cid string) string {
	return filepath.Join(r.containerDir(cid), userNSFile)
}

// attachNetwork attaches a user-namespaced sandbox's network once its task runs, asking for
// address ip when valid. Sandboxes without a user namespace were attached before their
// container was made (containerSpec).
func (r *runtime) attachNetwork(ctx context.Context, inst *instance, ip netip.Addr) error {
	if inst.ids == nil || r.net == nil {
		return nil
	}
	ref := inst.ref.Load()
	if ref == nil {
		return fmt.Errorf("network for %s: %w", inst.cid, errNoInit)
	}
	var opts []network.SetupOpt
	if ip.IsValid() {
		opts = append(opts, network.WithIP(ip))
	}
	att, err := r.net.Setup(ctx, inst.cid, append(opts, network.WithNetNSOf(int(inst.pid)))...)
	if err != nil {
		return fmt.Errorf("network for %s: %w", inst.cid, err)
	}
	// The namespace was pinned through the pid: if the init had exited, the pid could name
	// another process by then. Alive now means it was the init's.
	if err := ref.alive(); err != nil {
		r.teardownNetwork(ctx, inst.cid)
		return fmt.Errorf("network for %s: %w", inst.cid, err)
	}
	inst.ip = att.IP
	return nil
}

// reattachNetwork moves a user-namespaced sandbox's attachment into the network namespace of
// its new task (see above), keeping its address.
func (r *runtime) reattachNetwork(ctx context.Context, inst *instance) error {
	if inst.ids == nil || r.net == nil {
		return nil
	}
	if err := r.net.Teardown(ctx, inst.cid); err != nil {
		return fmt.Errorf("network for %s: %w", inst.cid, err)
	}
	return r.attachNetwork(ctx, inst, inst.ip)
}

func (r *runtime) teardownNetwork(ctx context.Context, cid string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.net.Teardown(cctx, cid); err != nil {
		log.L(ctx).Warn("tear down network", "sandbox", cid, "error", err)
	}
}

// unpinUserNS unmounts and removes a sandbox's pinned user namespace; none is fine.
func (r *runtime) unpinUserNS(cid string) error {
	path := r.userNSPath(cid)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount user namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove user namespace %s: %w", path, err)
	}
	return nil
}

// userNSSpec gives the container a new user namespace with mapping m and a new network
// namespace (made by runc inside it).
func userNSSpec(m IDMapping) []oci.SpecOpts {
	return []oci.SpecOpts{
		oci.WithUserNamespace(m.specMaps(), m.specMaps()),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace}),
	}
}

// unpinOrphanUserNS drops the user namespace pins of sandbox directories whose container does
// not exist (a daemon killed between making the namespace and creating the container).
func (r *runtime) unpinOrphanUserNS(ctx context.Context) {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if _, err := os.Lstat(r.userNSPath(e.Name())); err != nil {
			continue
		}
		if _, err := r.client.LoadContainer(ctx, e.Name()); !errdefs.IsNotFound(err) {
			continue
		}
		if err := r.unpinUserNS(e.Name()); err != nil {
			log.L(ctx).Warn("drop the user namespace of a vanished sandbox", "container", e.Name(), "error", err)
		}
	}
}
