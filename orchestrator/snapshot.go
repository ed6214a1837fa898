package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/snapsign"
)

// Emit receives progress events of long operations.
type Emit func(api.Progress)

// openStore opens an object store URI ("" = the daemon's).
func (o *Orchestrator) openStore(ctx context.Context, uri string) (objectstore.Store, string, error) {
	if uri == "" {
		uri = o.opts.ObjectStoreURI
	}
	st, err := objectstore.Open(ctx, uri, objectstore.WithCreateBucket(true))
	if err != nil {
		return nil, "", fmt.Errorf("object store %s: %w", uri, err)
	}
	return st, uri, nil
}

// SnapshotPush takes an L3 checkpoint of a sandbox and uploads it as a snapshot: the CRIU
// images, the full rootfs diff, the state document and the effect journal as content-addressed
// zstd blobs, then the manifest last, so a half upload is never visible.
func (o *Orchestrator) SnapshotPush(ctx context.Context, id, to string, emit Emit) (api.Snapshot, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	st, storeURI, err := o.openStore(ctx, to)
	if err != nil {
		return api.Snapshot{}, err
	}
	emit(api.Progress{Phase: "checkpoint"})
	ck, err := o.checkpoint(ctx, s, api.CheckpointRequest{Level: api.LevelL3, Message: "snapshot push"})
	if err != nil {
		return api.Snapshot{}, err
	}
	snap := api.Snapshot{Name: fmt.Sprintf("%s-%s", id, ck.ID), Sandbox: id, Checkpoint: ck.ID, FrozenMS: ck.FrozenMS}
	snap.URI = storeURI + "#" + snap.Name
	start := time.Now()
	blobs, cfg, err := o.packageSnapshot(ctx, s, ck)
	if err != nil {
		return snap, err
	}
	defer removeBlobs(blobs)
	if err := failpoint.Inject("push/packaged"); err != nil {
		return snap, err
	}
	snap.PackageMS = ms(time.Since(start))
	start = time.Now()
	if snap.Uploaded, err = uploadSnapshot(ctx, st, o.signer, snap.Name, blobs, cfg, emit); err != nil {
		return snap, err
	}
	snap.UploadMS = ms(time.Since(start))
	fillSnapshot(&snap, cfg, blobs)
	log.L(ctx).Info("snapshot pushed", "sandbox", id, "snapshot", snap.URI, "bytes", snap.Size, "uploaded", snap.Uploaded,
		"package_ms", snap.PackageMS, "upload_ms", snap.UploadMS)
	return snap, nil
}

// packageSnapshot stages the blobs of an L3 checkpoint in its directory; the config is last.
func (o *Orchestrator) packageSnapshot(ctx context.Context, s *session, ck api.Checkpoint) ([]blob, snapshotConfig, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	rec := s.ckpts[s.find(ck.ID)]
	cfg, err := o.snapshotConfig(ctx, s, rec)
	if err != nil {
		return nil, cfg, err
	}
	dir := rec.Images
	doc, err := savedState(dir)
	if err != nil {
		return nil, cfg, err
	}
	steps := []struct {
		media, title string
		compress     bool
		write        func(io.Writer) error
	}{
		{MediaCRIUImages, "criu-images.tar.zst", false, func(w io.Writer) error {
			meta, err := criu.Pack(ctx, filepath.Join(dir, "images"), w)
			cfg.CRIU = meta
			return err
		}},
		{MediaRootfsDiff, "rootfs.tar.zst", true, func(w io.Writer) error { return s.fs.Export(ctx, ck.ID, w) }},
		{MediaStateDocument, "state.json.zst", true, func(w io.Writer) error { _, err := w.Write(doc); return err }},
		{MediaEffects, "effects.json.zst", true, o.effectsBlob(ctx, s.id)},
	}
	if held, err := o.heldEffects(ctx, s.id, rec.EffectsWatermark); err != nil {
		return nil, cfg, err
	} else if held != nil {
		steps = append(steps, struct {
			media, title string
			compress     bool
			write        func(io.Writer) error
		}{MediaHeldEffects, "held-effects.json.zst", true, func(w io.Writer) error { _, err := w.Write(held); return err }})
	}
	var blobs []blob
	for _, step := range steps {
		b, err := stageBlob(dir, step.media, step.title, step.compress, step.write)
		if err != nil {
			removeBlobs(blobs)
			return nil, cfg, err
		}
		blobs = append(blobs, b)
	}
	c, err := stageBlob(dir, MediaConfig, "config.json", false, jsonBlob(cfg))
	if err != nil {
		removeBlobs(blobs)
		return nil, cfg, err
	}
	return append(blobs, c), cfg, nil
}

func (o *Orchestrator) snapshotConfig(ctx context.Context, s *session, rec ckptRecord) (snapshotConfig, error) {
	t, err := o.pools.Template(s.sb.Pool)
	if err != nil {
		return snapshotConfig{}, err
	}
	img, err := o.client.GetImage(ctx, t.Image)
	if err != nil {
		return snapshotConfig{}, fmt.Errorf("image %s: %w", t.Image, err)
	}
	return snapshotConfig{Format: snapshotFormat, Sandbox: s.id, Checkpoint: rec.ID, Created: time.Now().UTC(),
		Template: t, Image: t.Image, ImageDigest: img.Target().Digest.String(), StateSeq: rec.StateSeq,
		Lease:   snapshotLease{Env: s.sb.Env, Labels: s.sb.Labels, EgressPolicy: s.sb.EgressPolicy},
		History: s.snapshotHistory(rec.ID)}, nil
}

func removeBlobs(bs []blob) {
	for _, b := range bs {
		os.Remove(b.path)
	}
}

// uploadSnapshot puts the blobs (in parallel, skipping those the store has), then the
// manifest's signature and the manifest. It returns the bytes actually uploaded.
func uploadSnapshot(ctx context.Context, st objectstore.Store, signer *snapsign.Signer, name string, blobs []blob, cfg snapshotConfig, emit Emit) (int64, error) {
	cas := objectstore.NewCAS(st)
	var mu sync.Mutex
	var uploaded int64
	errs := make(chan error, len(blobs))
	var wg sync.WaitGroup
	for _, b := range blobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := uploadBlob(ctx, cas, b, emit)
			mu.Lock()
			uploaded += n
			mu.Unlock()
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return uploaded, err
		}
	}
	if err := failpoint.Inject("push/blobs-uploaded"); err != nil {
		return uploaded, err
	}
	m := newManifest(blobs[len(blobs)-1], blobs[:len(blobs)-1], cfg)
	data, err := json.Marshal(m)
	if err != nil {
		return uploaded, err
	}
	sig, err := signer.Sign(name, data)
	if err != nil {
		return uploaded, err
	}
	if err := st.Put(ctx, sigKey(name), strings.NewReader(string(sig)), int64(len(sig))); err != nil {
		return uploaded, fmt.Errorf("write manifest signature of %s: %w", name, err)
	}
	if err := st.Put(ctx, manifestKey(name), strings.NewReader(string(data)), int64(len(data))); err != nil {
		return uploaded, fmt.Errorf("write manifest of %s: %w", name, err)
	}
	_ = failpoint.Inject("push/manifest-written") // only "exit" means something here: it is visible
	return uploaded, nil
}

func uploadBlob(ctx context.Context, cas *objectstore.CAS, b blob, emit Emit) (int64, error) {
	f, err := os.Open(b.path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	title := b.desc.Annotations[annotationTitle]
	r := &progressReader{r: f, emit: emit, p: api.Progress{Phase: "upload", Blob: title, Total: b.desc.Size}}
	sent, err := cas.Put(ctx, b.desc.Digest, r, b.desc.Size)
	if err != nil {
		return 0, fmt.Errorf("upload %s: %w", title, err)
	}
	emit(api.Progress{Phase: "upload", Blob: title, Done: b.desc.Size, Total: b.desc.Size})
	if !sent {
		return 0, nil
	}
	return b.desc.Size, nil
}

// progressReader emits progress at most every 32 MiB.
type progressReader struct {
	r    io.Reader
	emit Emit
	p    api.Progress
	last int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.p.Done += int64(n)
	if p.p.Done-p.last >= 32<<20 {
		p.last = p.p.Done
		p.emit(p.p)
	}
	return n, err
}

func fillSnapshot(s *api.Snapshot, c snapshotConfig, blobs []blob) {
	s.Created, s.Image, s.ImageDigest = c.Created, c.Image, c.ImageDigest
	s.CRIUVersion, s.Kernel, s.Arch = c.CRIU.CRIUVersion, c.CRIU.Kernel, c.CRIU.Arch
	for _, b := range blobs {
		s.Size += b.desc.Size
	}
}

// Snapshots lists the snapshots in a store ("" = the daemon's).
func (o *Orchestrator) Snapshots(ctx context.Context, uri string) ([]api.Snapshot, error) {
	st, storeURI, err := o.openStore(ctx, uri)
	if err != nil {
		return nil, err
	}
	found, err := manifests(ctx, st)
	if err != nil {
		return nil, err
	}
	out := []api.Snapshot{}
	for name, f := range found {
		s := api.Snapshot{Name: name, URI: storeURI + "#" + name, Sandbox: f.cfg.Sandbox, Checkpoint: f.cfg.Checkpoint}
		fillSnapshot(&s, f.cfg, descBlobs(f.m))
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

type storedSnapshot struct {
	m   ocispec.Manifest
	cfg snapshotConfig
}

// manifests reads every snapshot manifest of a store; unreadable ones are logged and skipped.
func manifests(ctx context.Context, st objectstore.Store) (map[string]storedSnapshot, error) {
	infos, err := st.List(ctx, "snapshots/")
	if err != nil {
		return nil, err
	}
	cas := objectstore.NewCAS(st)
	out := map[string]storedSnapshot{}
	for _, in := range infos {
		name, ok := strings.CutSuffix(strings.TrimPrefix(in.Key, "snapshots/"), "/manifest.json")
		if !ok {
			continue
		}
		m, c, err := readManifest(ctx, st, cas, name)
		if err != nil {
			log.L(ctx).Warn("unreadable snapshot", "name", name, "error", err)
			continue
		}
		out[name] = storedSnapshot{m: m, cfg: c}
	}
	return out, nil
}

func descBlobs(m ocispec.Manifest) []blob {
	bs := []blob{{desc: m.Config}}
	for _, l := range m.Layers {
		bs = append(bs, blob{desc: l})
	}
	return bs
}

// SnapshotRemove deletes a snapshot's manifest, then the blobs no other snapshot references.
func (o *Orchestrator) SnapshotRemove(ctx context.Context, uri string) error {
	storeURI, name, err := parseSnapshotURI(uri, o.opts.ObjectStoreURI)
	if err != nil {
		return err
	}
	st, _, err := o.openStore(ctx, storeURI)
	if err != nil {
		return err
	}
	cas := objectstore.NewCAS(st)
	m, _, err := readManifest(ctx, st, cas, name)
	if err != nil {
		return err
	}
	if err := st.Delete(ctx, manifestKey(name)); err != nil {
		return err
	}
	if err := st.Delete(ctx, sigKey(name)); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	keep, err := referencedBlobs(ctx, st)
	if err != nil {
		return err
	}
	for _, b := range descBlobs(m) {
		if !keep[b.desc.Digest.String()] {
			if err := cas.Delete(ctx, b.desc.Digest); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// referencedBlobs is the set of blob digests the store's remaining snapshots use.
func referencedBlobs(ctx context.Context, st objectstore.Store) (map[string]bool, error) {
	found, err := manifests(ctx, st)
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for _, f := range found {
		for _, b := range descBlobs(f.m) {
			keep[b.desc.Digest.String()] = true
		}
	}
	return keep, nil
}

// heldEffects is the full form of the effects the sandbox held at the checkpoint whose
// watermark is upto, for the snapshot to carry; nil when it held none.
func (o *Orchestrator) heldEffects(ctx context.Context, id string, upto uint64) ([]byte, error) {
	c, ok := o.effects.(heldCarrier)
	if !ok {
		return nil, nil
	}
	held, err := c.ExportHeld(ctx, id, upto)
	if err != nil || string(held) == "[]" {
		return nil, err
	}
	return held, nil
}
