package orchestrator

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// Restore creates a new sandbox from a snapshot: a new container (own ID, cgroup, network
// identity, effect journal and machine id) from the snapshot's image, the rootfs diff applied,
// the processes restored by CRIU, the agent state as it was. It is leased at once.
func (o *Orchestrator) Restore(ctx context.Context, uri, poolName string, emit Emit) (api.Lease, error) {
	return o.RestoreWith(ctx, api.RestoreRequest{URI: uri, Pool: poolName}, emit)
}

// RestoreWith is Restore with every option of the request (AdoptHeldEffects).
//
// Only the verified manifest and config are needed to choose the target; the blobs are
// needed only by the task's start. So the blobs download while the pool creates the
// container, its spec and its disk, and the task waits for them, every one verified against
// its digest, before it touches them (restoreTask). A failed download fails the task (the
// pool removes the container); a failed create stops the download; the temp dir goes
// either way.
func (o *Orchestrator) RestoreWith(ctx context.Context, req api.RestoreRequest, emit Emit) (api.Lease, error) {
	if !o.criu.Available {
		return api.Lease{}, fmt.Errorf("L3 restores are unavailable on this node: %s: %w", o.criu.Reason, errdefs.ErrFailedPrecondition)
	}
	src, err := o.openSnapshot(ctx, req.URI)
	if err != nil {
		return api.Lease{}, err
	}
	to, err := o.restoreInto(ctx, src.cfg, src.uri, req.Pool)
	if err != nil {
		return api.Lease{}, err
	}
	to.adopt = req.AdoptHeldEffects
	dl, err := o.startDownload(ctx, src, emit)
	if err != nil {
		return api.Lease{}, err
	}
	defer dl.close()
	return o.restoreFetched(ctx, dl, to, emit)
}

// restoreTarget is where and how a fetched snapshot is restored.
type restoreTarget struct {
	pool    string
	lease   pool.LeaseRequest
	message string // of the restored sandbox's first checkpoint
	adopt   bool   // adopt the held effects the snapshot carries
}

// restoreInto decides a restore's target: the pool (given, or the snapshot's pool name) must
// exist here and run the snapshot's image; the sandbox gets that pool's template and the
// snapshot's lease env and labels, and the snapshot's egress policy only if it does not widen
// the pool's.
func (o *Orchestrator) restoreInto(ctx context.Context, cfg snapshotConfig, uri, poolName string) (restoreTarget, error) {
	if poolName == "" {
		poolName = cfg.Template.Name
	}
	t, err := o.restorePool(ctx, poolName, cfg)
	if err != nil {
		return restoreTarget{}, err
	}
	policy, err := restorePolicy(cfg.Lease.EgressPolicy, t.EgressPolicy)
	if err != nil {
		return restoreTarget{}, fmt.Errorf("restore snapshot %s-%s into pool %q: %w", cfg.Sandbox, cfg.Checkpoint, poolName, err)
	}
	return restoreTarget{pool: poolName, message: "restored from " + uri,
		lease: pool.LeaseRequest{Env: cfg.Lease.Env, Labels: cfg.Lease.Labels, EgressPolicy: policy, RestoredFrom: uri}}, nil
}

// restoreFetched leases a sandbox restored from dl's snapshot into to, then adopts the
// snapshot's held effects when asked and seeds the sandbox's session.
func (o *Orchestrator) restoreFetched(ctx context.Context, dl *download, to restoreTarget, emit Emit) (api.Lease, error) {
	res, f, err := leaseRestored(ctx, o.pools, dl, to, o.restoreTask(dl, emit))
	if err != nil {
		return api.Lease{}, err
	}
	if to.adopt && f.held != nil {
		if err := o.adoptHeld(ctx, res.ID, f.held); err != nil {
			o.releaseRestored(ctx, res.ID)
			return api.Lease{}, err
		}
	}
	o.startSessionWith(ctx, res.Sandbox, seedFor(f, to.message))
	log.L(ctx).Info("snapshot restored", "sandbox", res.ID, "from", f.cfg.Sandbox, "checkpoint", f.cfg.Checkpoint)
	return api.Lease{LeaseResult: apiLeaseResult(res)}, nil
}

// restoredLeaser creates and leases a sandbox whose task a RestoreFunc starts (pool.Manager).
type restoredLeaser interface {
	LeaseRestored(ctx context.Context, pool string, req pool.LeaseRequest, restore pool.RestoreFunc) (pool.LeaseResult, error)
}

// leaseRestored leases a sandbox of to's pool whose task task starts; task waits for dl
// before it uses the snapshot, so a lease means dl's snapshot is there and verified.
func leaseRestored(ctx context.Context, lr restoredLeaser, dl *download, to restoreTarget, task pool.RestoreFunc) (pool.LeaseResult, *fetched, error) {
	res, err := lr.LeaseRestored(ctx, to.pool, to.lease, task)
	if err != nil {
		return res, nil, fmt.Errorf("restore snapshot %s-%s: %w", dl.f.cfg.Sandbox, dl.f.cfg.Checkpoint, err)
	}
	return res, dl.f, nil
}

func (o *Orchestrator) releaseRestored(ctx context.Context, id string) {
	if err := o.pools.Release(context.WithoutCancel(ctx), id); err != nil {
		log.L(ctx).Warn("release after a failed adoption of held effects", "sandbox", id, "error", err)
	}
}

// restorePool returns the template of the pool a snapshot is restored into, which must exist
// and run the snapshot's image at the same digest. A restore never creates a pool from the
// snapshot's template: its limits and egress policy are the snapshot writer's, not this node's.
func (o *Orchestrator) restorePool(ctx context.Context, name string, cfg snapshotConfig) (pool.Template, error) {
	t, err := o.pools.Template(name)
	if errdefs.IsNotFound(err) {
		return t, fmt.Errorf("pool %q does not exist on this node; a restore does not create pools from a snapshot's template (its limits and egress policy would be the snapshot's): create it (deltabox pool create %s --image %s) or name another with --pool: %w",
			name, name, cfg.Image, errdefs.ErrNotFound)
	}
	if err != nil {
		return t, err
	}
	if t.Image != cfg.Image {
		return t, fmt.Errorf("pool %q runs %s, the snapshot needs %s: %w", name, t.Image, cfg.Image, errdefs.ErrFailedPrecondition)
	}
	img, err := o.client.GetImage(ctx, cfg.Image)
	if err != nil {
		return t, fmt.Errorf("image %s of the snapshot: %w", cfg.Image, err)
	}
	if d := img.Target().Digest.String(); d != cfg.ImageDigest {
		return t, fmt.Errorf("image %s is %s here but the snapshot was taken on %s; restored processes need the same files: %w",
			cfg.Image, d, cfg.ImageDigest, errdefs.ErrFailedPrecondition)
	}
	return t, nil
}

// restoreTask is the pool's RestoreFunc of a restore from dl. What needs only the fresh
// container (its CRIU config path, its user namespace) is read while the blobs download;
// then it waits for the download, whose every blob matched its digest, and applies the
// rootfs diff into the fresh upper dir, gives the sandbox a new machine id, writes the CRIU
// options of a new identity (writeNewIdentityConfig) and runs CRIU.
func (o *Orchestrator) restoreTask(dl *download, emit Emit) pool.RestoreFunc {
	return func(ctx context.Context, c containerd.Container, layout pool.Layout, ioc cio.Creator) (containerd.Task, error) {
		if err := failpoint.Inject("restore/container-created"); err != nil {
			return nil, err
		}
		conf, err := criu.ConfigOf(ctx, c)
		if err != nil {
			return nil, err
		}
		m, err := userNSOf(ctx, c)
		if err != nil {
			return nil, err
		}
		waitStart := time.Now()
		f, err := dl.wait(ctx)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		emit(api.Progress{Phase: "restore"})
		if err := o.writeNewIdentityConfig(conf, f.images); err != nil {
			return nil, err
		}
		ids, err := remapInto(c.ID(), m, f.images)
		if err != nil {
			return nil, err
		}
		if err := applyRootfs(ctx, f.rootfs, f.rootfsSize, layout.Upper, ids...); err != nil {
			return nil, err
		}
		if err := freshMachineID(layout); err != nil {
			return nil, err
		}
		applied := time.Now()
		t, err := o.restoreWithTimeout(ctx, c.ID(), f.images, ioc)
		if err == nil {
			err = failpoint.Inject("restore/restored") // the pool's cleanup kills the task
		}
		log.L(ctx).Debug("snapshot task restored", "container", c.ID(), "download_wait", start.Sub(waitStart),
			"rootfs", applied.Sub(start), "criu", time.Since(applied))
		return t, err
	}
}

// userNSOf returns the uid mapping of container c's user namespace, nil without one.
func userNSOf(ctx context.Context, c containerd.Container) (*specs.LinuxIDMapping, error) {
	spec, err := c.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("spec of %s: %w", c.ID(), err)
	}
	return criu.SpecMapping(spec)
}

// intoUserNS prepares images and a rootfs diff (which hold the ids the dumped sandbox saw)
// for container c: in a user namespace, the images' namespace is moved into c's id range
// (criu.RemapUserNS; CRIU checks the result against c's spec) and the returned option moves
// the diff's owners likewise. Without one, nothing moves.
func intoUserNS(ctx context.Context, c containerd.Container, images string) ([]overlay.ImportOption, error) {
	m, err := userNSOf(ctx, c)
	if err != nil {
		return nil, err
	}
	return remapInto(c.ID(), m, images)
}

// remapInto is intoUserNS for container cid whose mapping m (userNSOf) is at hand.
func remapInto(cid string, m *specs.LinuxIDMapping, images string) ([]overlay.ImportOption, error) {
	if m == nil {
		return nil, nil
	}
	if err := criu.RemapUserNS(images, *m); err != nil {
		return nil, fmt.Errorf("move the processes into the user namespace of %s: %w", cid, err)
	}
	return []overlay.ImportOption{overlay.WithIDShift(m.HostID, m.Size)}, nil
}

func applyRootfs(ctx context.Context, path string, size int64, upper string, opts ...overlay.ImportOption) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	zr, err := zstd.NewReader(file)
	if err != nil {
		return err
	}
	defer zr.Close()
	br := &boundedReader{r: zr, n: size, what: "rootfs diff"}
	if err := overlay.Import(ctx, br, upper, append(opts, overlay.WithOverlayWhiteouts())...); err != nil {
		return fmt.Errorf("apply rootfs diff: %w", err)
	}
	return nil
}

// freshMachineID gives a restored sandbox its own /etc/machine-id when the image or the
// snapshot has one. The upper dir holds the snapshot's files, which the sandbox controlled:
// /etc/machine-id may be a symlink to a host file, /etc itself one to a host directory. The
// write goes through internal/rootfs (openat2 beneath the upper dir, no symlink followed; an
// existing entry is unlinked, the file created O_EXCL|O_NOFOLLOW), so it lands in the upper
// dir or fails.
func freshMachineID(layout pool.Layout) error {
	found := false
	for _, dir := range append([]string{layout.Upper}, layout.Lower...) {
		if _, err := os.Lstat(filepath.Join(dir, "etc", "machine-id")); err == nil {
			found = true
			break
		}
	}
	if !found {
		return nil
	}
	root, err := rootfs.Open(layout.Upper)
	if err != nil {
		return err
	}
	defer root.Close()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := []byte(hex.EncodeToString(b) + "\n")
	var buf bytes.Buffer
	tw, now := tar.NewWriter(&buf), time.Now()
	if _, err := root.Lstat("etc"); errdefs.IsNotFound(err) { // /etc only in the image
		_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now})
	}
	_ = tw.WriteHeader(&tar.Header{Name: "etc/machine-id", Typeflag: tar.TypeReg, Mode: 0o444, Size: int64(len(id)), ModTime: now})
	_, _ = tw.Write(id)
	_ = tw.Close()
	if _, err := root.Extract("/", tar.NewReader(&buf), rootfs.ExtractOptions{}); err != nil {
		return fmt.Errorf("renew /etc/machine-id of the restored sandbox: %w", err)
	}
	return nil
}

// Fork pushes one snapshot of a sandbox and restores it req.Count times into its pool; the
// pushed snapshot is removed afterwards unless req.KeepSnapshot.
func (o *Orchestrator) Fork(ctx context.Context, id string, req api.SnapshotRequest, emit Emit) ([]api.Lease, error) {
	if req.Count < 1 || req.Count > 64 {
		return nil, fmt.Errorf("fork count %d: want 1 to 64: %w", req.Count, errdefs.ErrInvalidArgument)
	}
	sb, err := o.pools.Get(id)
	if err != nil {
		return nil, err
	}
	snap, err := o.SnapshotPush(ctx, id, req.To, emit)
	if err != nil {
		return nil, err
	}
	if !req.KeepSnapshot {
		defer o.dropForkSnapshot(ctx, snap.URI)
	}
	src, err := o.openSnapshot(ctx, snap.URI)
	if err != nil {
		return nil, err
	}
	target, err := o.forkInto(sb, snap.Checkpoint)
	if err != nil {
		return nil, err
	}
	dl, err := o.startDownload(ctx, src, emit) // beside the first fork's create; the others reuse it
	if err != nil {
		return nil, err
	}
	defer dl.close() // before the snapshot is dropped
	var leases []api.Lease
	for range req.Count {
		l, err := o.restoreFetched(ctx, dl, target, emit)
		if err != nil {
			return leases, fmt.Errorf("fork %d of %d: %w", len(leases)+1, req.Count, err)
		}
		leases = append(leases, l)
	}
	return leases, nil
}

// dropForkSnapshot removes the snapshot a fork pushed (its manifest, signature and the blobs
// no other snapshot uses); it survives cancellation of the request.
func (o *Orchestrator) dropForkSnapshot(ctx context.Context, uri string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := o.SnapshotRemove(ctx, uri); err != nil {
		log.L(ctx).Warn("remove the snapshot a fork pushed", "snapshot", uri, "error", err)
	}
}

// forkInto is the target of a fork: the source's own pool and lease settings, taken from the
// live source sandbox on this node, not from the pushed snapshot.
func (o *Orchestrator) forkInto(sb pool.Sandbox, ckpt string) (restoreTarget, error) {
	t, err := o.pools.Template(sb.Pool)
	if err != nil {
		return restoreTarget{}, err
	}
	policy := sb.EgressPolicy
	if policy == t.EgressPolicy {
		policy = ""
	}
	from := sb.ID + "@" + ckpt
	return restoreTarget{pool: sb.Pool, message: "forked from " + from,
		lease: pool.LeaseRequest{Env: sb.Env, Labels: sb.Labels, EgressPolicy: policy, ForkedFrom: from}}, nil
}

// restoreWithTimeout is a CRIU restore bounded by the configured restore timeout; one that
// runs past it is stopped and its task deleted (the pool removes the container).
func (o *Orchestrator) restoreWithTimeout(ctx context.Context, cid, images string, ioc cio.Creator) (containerd.Task, error) {
	ctx, cancel := context.WithTimeout(ctx, o.opts.Snapshots.RestoreTimeout)
	defer cancel()
	return o.restoreL3(ctx, cid, images, ioc)
}

// adoptHeld makes the snapshot's held effects held effects of the restored sandbox id.
func (o *Orchestrator) adoptHeld(ctx context.Context, id string, held []byte) error {
	c, ok := o.effects.(heldCarrier)
	if !ok {
		return fmt.Errorf("the snapshot carries held effects but this node has no egress proxy to hold them: %w", errdefs.ErrFailedPrecondition)
	}
	n, err := c.AdoptHeld(ctx, id, held)
	if err != nil {
		return fmt.Errorf("adopt the snapshot's held effects: %w", err)
	}
	log.L(ctx).Info("held effects adopted from the snapshot", "sandbox", id, "effects", n)
	return nil
}
