package orchestrator

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// fetched is a snapshot downloaded and verified into a local directory.
type fetched struct {
	uri    string // STORE#NAME
	dir    string
	cfg    snapshotConfig
	images string // unpacked CRIU images
	rootfs string // rootfs diff (tar+zstd)
	// rootfsSize is what the rootfs diff decompresses to, as the manifest records it.
	rootfsSize int64
	state      json.RawMessage
	held       []byte // the held effects the snapshot carries (nil: none)
}

// Restore creates a new sandbox from a snapshot: a new container (own ID, cgroup, network
// identity, effect journal and machine id) from the snapshot's image, the rootfs diff applied,
// the processes restored by CRIU, the agent state as it was. It is leased at once.
func (o *Orchestrator) Restore(ctx context.Context, uri, poolName string, emit Emit) (api.Lease, error) {
	return o.RestoreWith(ctx, api.RestoreRequest{URI: uri, Pool: poolName}, emit)
}

// RestoreWith is Restore with every option of the request (AdoptHeldEffects).
func (o *Orchestrator) RestoreWith(ctx context.Context, req api.RestoreRequest, emit Emit) (api.Lease, error) {
	uri, poolName := req.URI, req.Pool
	if !o.criu.Available {
		return api.Lease{}, fmt.Errorf("L3 restores are unavailable on this node: %s: %w", o.criu.Reason, errdefs.ErrFailedPrecondition)
	}
	start := time.Now()
	f, err := o.fetchSnapshot(ctx, uri, emit)
	if err != nil {
		return api.Lease{}, err
	}
	defer os.RemoveAll(f.dir)
	if err := failpoint.Inject("restore/fetched"); err != nil {
		return api.Lease{}, err
	}
	log.L(ctx).Debug("snapshot fetched", "uri", uri, "duration", time.Since(start))
	to, err := o.restoreInto(ctx, f, poolName)
	if err != nil {
		return api.Lease{}, err
	}
	to.adopt = req.AdoptHeldEffects
	return o.restoreFetched(ctx, f, to, emit)
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
func (o *Orchestrator) restoreInto(ctx context.Context, f *fetched, poolName string) (restoreTarget, error) {
	if poolName == "" {
		poolName = f.cfg.Template.Name
	}
	t, err := o.restorePool(ctx, poolName, f.cfg)
	if err != nil {
		return restoreTarget{}, err
	}
	policy, err := restorePolicy(f.cfg.Lease.EgressPolicy, t.EgressPolicy)
	if err != nil {
		return restoreTarget{}, fmt.Errorf("restore snapshot %s-%s into pool %q: %w", f.cfg.Sandbox, f.cfg.Checkpoint, poolName, err)
	}
	return restoreTarget{pool: poolName, message: "restored from " + f.uri,
		lease: pool.LeaseRequest{Env: f.cfg.Lease.Env, Labels: f.cfg.Lease.Labels, EgressPolicy: policy, RestoredFrom: f.uri}}, nil
}

func (o *Orchestrator) restoreFetched(ctx context.Context, f *fetched, to restoreTarget, emit Emit) (api.Lease, error) {
	emit(api.Progress{Phase: "restore"})
	res, err := o.pools.LeaseRestored(ctx, to.pool, to.lease, o.restoreTask(f))
	if err != nil {
		return api.Lease{}, fmt.Errorf("restore snapshot %s-%s: %w", f.cfg.Sandbox, f.cfg.Checkpoint, err)
	}
	if to.adopt && f.held != nil {
		if err := o.adoptHeld(ctx, res.ID, f.held); err != nil {
			if rerr := o.pools.Release(context.WithoutCancel(ctx), res.ID); rerr != nil {
				log.L(ctx).Warn("release after a failed adoption of held effects", "sandbox", res.ID, "error", rerr)
			}
			return api.Lease{}, err
		}
	}
	o.startSessionWith(ctx, res.Sandbox, seedFor(f, to.message))
	log.L(ctx).Info("snapshot restored", "sandbox", res.ID, "from", f.cfg.Sandbox, "checkpoint", f.cfg.Checkpoint)
	return api.Lease{LeaseResult: apiLeaseResult(res)}, nil
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

// restoreTask is the pool's RestoreFunc: rootfs diff into the fresh upper dir, a new machine
// id, the CRIU options of a new identity (writeNewIdentityConfig), then CRIU.
func (o *Orchestrator) restoreTask(f *fetched) pool.RestoreFunc {
	return func(ctx context.Context, c containerd.Container, layout pool.Layout, ioc cio.Creator) (containerd.Task, error) {
		if err := failpoint.Inject("restore/container-created"); err != nil {
			return nil, err
		}
		conf, err := criu.ConfigOf(ctx, c)
		if err != nil {
			return nil, err
		}
		if err := o.writeNewIdentityConfig(conf, f.images); err != nil {
			return nil, err
		}
		ids, err := intoUserNS(ctx, c, f.images)
		if err != nil {
			return nil, err
		}
		start := time.Now()
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
		log.L(ctx).Debug("snapshot task restored", "container", c.ID(), "rootfs", applied.Sub(start), "criu", time.Since(applied))
		return t, err
	}
}

// intoUserNS prepares images and a rootfs diff (which hold the ids the dumped sandbox saw)
// for container c: in a user namespace, the images' namespace is moved into c's id range
// (criu.RemapUserNS; CRIU checks the result against c's spec) and the returned option moves
// the diff's owners likewise. Without one, nothing moves.
func intoUserNS(ctx context.Context, c containerd.Container, images string) ([]overlay.ImportOption, error) {
	spec, err := c.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("spec of %s: %w", c.ID(), err)
	}
	m, err := criu.SpecMapping(spec)
	if err != nil || m == nil {
		return nil, err
	}
	if err := criu.RemapUserNS(images, *m); err != nil {
		return nil, fmt.Errorf("move the processes into the user namespace of %s: %w", c.ID(), err)
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

// fetchSnapshot downloads a snapshot into a temp dir, every blob verified against its digest
// before anything is created.
func (o *Orchestrator) fetchSnapshot(ctx context.Context, uri string, emit Emit) (_ *fetched, retErr error) {
	storeURI, name, err := parseSnapshotURI(uri, o.opts.ObjectStoreURI)
	if err != nil {
		return nil, err
	}
	st, _, err := o.openStore(ctx, storeURI)
	if err != nil {
		return nil, err
	}
	cas := objectstore.NewCAS(st)
	m, cfg, err := verifiedManifest(ctx, st, cas, name, o.trust)
	if err != nil {
		return nil, err
	}
	if err := criu.CheckCompatible(cfg.CRIU, o.criu); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", uri, err)
	}
	if err := failpoint.Inject("restore/verified"); err != nil {
		return nil, err
	}
	base := filepath.Join(o.opts.Root, "restore")
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(base, name+"-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	f := &fetched{dir: dir, cfg: cfg, uri: storeURI + "#" + name, images: filepath.Join(dir, "images"), rootfs: filepath.Join(dir, "rootfs.tar.zst")}
	return f, f.download(ctx, cas, m, emit)
}

func (f *fetched) download(ctx context.Context, cas *objectstore.CAS, m ocispec.Manifest, emit Emit) error {
	d, err := layerByType(m, MediaCRIUImages)
	if err == nil {
		err = fetchImages(ctx, cas, d, f.cfg.CRIU, f.images, emit)
	}
	if err != nil {
		return err
	}
	d, err = layerByType(m, MediaRootfsDiff)
	if err == nil {
		f.rootfsSize, err = uncompressedSize(d)
	}
	if err == nil {
		err = fetchBlob(ctx, cas, d, f.rootfs, emit)
	}
	if err != nil {
		return err
	}
	if d, err := layerByType(m, MediaHeldEffects); err == nil { // only when effects were held
		if f.held, err = fetchSmallBlob(ctx, cas, d, filepath.Join(f.dir, "held-effects.json.zst"), emit); err != nil {
			return err
		}
	}
	d, err = layerByType(m, MediaStateDocument)
	if err != nil {
		return err
	}
	size, err := uncompressedSize(d)
	if err != nil {
		return err
	}
	p := filepath.Join(f.dir, "state.json.zst")
	if err := fetchBlob(ctx, cas, d, p, emit); err != nil {
		return err
	}
	f.state, err = readZstd(p, size)
	return err
}

// fetchImages unpacks the CRIU images blob into dir as it downloads, hashing it on the way:
// the download and the unpack overlap instead of going through a staging file. The unpack
// refuses anything but plain files and directories under dir, and CRIU sees the images only
// after the whole blob matched its digest.
func fetchImages(ctx context.Context, cas *objectstore.CAS, d ocispec.Descriptor, meta criu.Meta, dir string, emit Emit) error {
	if meta.UnpackedBytes <= 0 || meta.Entries <= 0 {
		return fmt.Errorf("snapshot config records no unpacked size of the CRIU images: %w", errdefs.ErrInvalidArgument)
	}
	return fetch(ctx, cas, d, emit, func(r io.Reader) error {
		return criu.Unpack(ctx, r, dir, criu.WithLimits(meta.UnpackedBytes, meta.Entries))
	})
}

// fetchBlob downloads a blob to path. The file is a staging copy under the restore's temp
// dir, removed afterwards, so it is not fsynced: a crash leaves nothing that needs it.
func fetchBlob(ctx context.Context, cas *objectstore.CAS, d ocispec.Descriptor, path string, emit Emit) error {
	return fetch(ctx, cas, d, emit, func(r io.Reader) error {
		out, err := os.Create(path)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, r); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// fetch streams blob d through consume, reporting progress, then reads it to the end, where
// the CAS reader fails if the digest differs (consume may stop early: an archive can end
// before its blob does, at a zstd frame trailer or padding).
func fetch(ctx context.Context, cas *objectstore.CAS, d ocispec.Descriptor, emit Emit, consume func(io.Reader) error) error {
	title := d.Annotations[annotationTitle]
	r, err := cas.Get(ctx, d.Digest)
	if err != nil {
		return fmt.Errorf("download %s: %w", title, err)
	}
	defer r.Close()
	pr := &progressReader{r: r, emit: emit, p: api.Progress{Phase: "download", Blob: title, Total: d.Size}}
	if err := consume(pr); err != nil {
		return fmt.Errorf("download %s (%s): %w", title, d.Digest, err)
	}
	if _, err := io.Copy(io.Discard, pr); err != nil {
		return fmt.Errorf("download %s (%s): %w", title, d.Digest, err)
	}
	emit(api.Progress{Phase: "download", Blob: title, Done: d.Size, Total: d.Size})
	return nil
}

// readZstd reads a zstd file that decompresses to size bytes (at most 64 MiB).
func readZstd(path string, size int64) ([]byte, error) {
	if size > 64<<20 {
		return nil, fmt.Errorf("%s decompresses to %d bytes, over 64 MiB: %w", filepath.Base(path), size, errdefs.ErrInvalidArgument)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return io.ReadAll(&boundedReader{r: zr, n: size, what: filepath.Base(path)})
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
	f, err := o.fetchSnapshot(ctx, snap.URI, emit)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(f.dir)
	target, err := o.forkInto(sb, snap.Checkpoint)
	if err != nil {
		return nil, err
	}
	var leases []api.Lease
	for range req.Count {
		l, err := o.restoreFetched(ctx, f, target, emit)
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

// fetchSmallBlob downloads a zstd JSON blob to path and returns it decompressed (bounded by
// the size its descriptor records).
func fetchSmallBlob(ctx context.Context, cas *objectstore.CAS, d ocispec.Descriptor, path string, emit Emit) ([]byte, error) {
	size, err := uncompressedSize(d)
	if err != nil {
		return nil, err
	}
	if err := fetchBlob(ctx, cas, d, path, emit); err != nil {
		return nil, err
	}
	return readZstd(path, size)
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
