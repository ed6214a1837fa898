package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
	specsv "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/snapsign"
	"github.com/deltabox/deltabox/pool"
)

// Media types of a DeltaBox snapshot (docs/snapshot-format.md).
const (
	ArtifactSnapshot   = "application/vnd.deltabox.snapshot.v1"
	MediaConfig        = "application/vnd.deltabox.snapshot.config.v1+json"
	MediaCRIUImages    = "application/vnd.deltabox.criu.images.v1.tar+zstd"
	MediaRootfsDiff    = ocispec.MediaTypeImageLayerZstd
	MediaStateDocument = "application/vnd.deltabox.state.v1+json+zstd"
	MediaEffects       = "application/vnd.deltabox.effects.v1+json+zstd"
	// MediaHeldEffects (only when the sandbox held effects at the checkpoint): those effects
	// in full, which a restore may adopt (api.RestoreRequest.AdoptHeldEffects).
	MediaHeldEffects = "application/vnd.deltabox.effects.held.v1+json+zstd"

	annotationTitle = ocispec.AnnotationTitle
	// annotationUncompressed records what a zstd blob decompresses to; restores refuse more.
	annotationUncompressed = "io.deltabox.uncompressed-size"
	snapshotFormat         = 1
)

// snapshotConfig is the config blob: what the snapshot is of and what restoring needs.
type snapshotConfig struct {
	Format      int           `json:"format"`
	Sandbox     string        `json:"sandbox"`
	Checkpoint  string        `json:"checkpoint"`
	Created     time.Time     `json:"created"`
	Template    pool.Template `json:"template"`
	Image       string        `json:"image"`
	ImageDigest string        `json:"image_digest"`
	CRIU        criu.Meta     `json:"criu"`
	StateSeq    uint64        `json:"state_seq"`
	Lease       snapshotLease `json:"lease"`
	// History is the source's checkpoints up to and including Checkpoint (those it inherited
	// from its own snapshot first); a restored sandbox lists them, its first checkpoint
	// taking Checkpoint's ID.
	History []api.Checkpoint `json:"history,omitempty"`
}

// snapshotLease is what the snapshot's sandbox was leased with; a restore keeps it (the
// egress policy only when it does not widen the target pool's, see restorePolicy).
type snapshotLease struct {
	Env          []string          `json:"env,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	EgressPolicy string            `json:"egress_policy,omitempty"` // the sandbox's policy (its lease's or its pool's)
}

var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// manifestKey is where a snapshot's manifest lives in a store; it is written last.
func manifestKey(name string) string { return "snapshots/" + name + "/manifest.json" }

// parseSnapshotURI splits "STORE#NAME" (or a bare NAME in defaultStore).
func parseSnapshotURI(uri, defaultStore string) (store, name string, err error) {
	store, name = defaultStore, uri
	if i := strings.LastIndexByte(uri, '#'); i >= 0 {
		store, name = uri[:i], uri[i+1:]
	}
	if !snapshotNameRE.MatchString(name) {
		return "", "", fmt.Errorf("snapshot URI %q: want STORE#NAME or NAME with NAME of [A-Za-z0-9._-]: %w", uri, errdefs.ErrInvalidArgument)
	}
	return store, name, nil
}

// blob is one packaged blob staged in a local file before upload.
type blob struct {
	desc ocispec.Descriptor
	path string
}

// stageBlob writes a blob to a temp file under dir, optionally zstd-compressing it, while
// hashing what goes to disk.
func stageBlob(dir, mediaType, title string, compress bool, write func(io.Writer) error) (blob, error) {
	f, err := os.CreateTemp(dir, "blob-*")
	if err != nil {
		return blob{}, err
	}
	defer f.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	var w io.Writer = cw
	var zw *zstd.Encoder
	raw := cw // what the blob decompresses to
	if compress {
		if zw, err = zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.SpeedFastest)); err != nil {
			return blob{}, err
		}
		raw = &countWriter{w: zw}
		w = raw
	}
	if err := write(w); err != nil {
		return blob{}, fmt.Errorf("package %s: %w", title, err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return blob{}, err
		}
	}
	d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.NewDigest(digest.SHA256, h), Size: cw.n,
		Annotations: map[string]string{annotationTitle: title}}
	if compress {
		d.Annotations[annotationUncompressed] = strconv.FormatInt(raw.n, 10)
	}
	return blob{desc: d, path: f.Name()}, f.Sync()
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// jsonBlob writes v as JSON.
func jsonBlob(v any) func(io.Writer) error {
	return func(w io.Writer) error { return json.NewEncoder(w).Encode(v) }
}

// newManifest lists the config and layer blobs; its annotations make `snapshot ls` cheap.
func newManifest(cfg blob, layers []blob, c snapshotConfig) ocispec.Manifest {
	m := ocispec.Manifest{Versioned: specsv.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactSnapshot, Config: cfg.desc,
		Annotations: map[string]string{
			ocispec.AnnotationCreated: c.Created.Format(time.RFC3339Nano),
			"io.deltabox.sandbox":     c.Sandbox, "io.deltabox.checkpoint": c.Checkpoint,
			"io.deltabox.image": c.Image,
		}}
	for _, l := range layers {
		m.Layers = append(m.Layers, l.desc)
	}
	return m
}

// sigKey is where a snapshot's detached manifest signature lives; it is written just before
// the manifest.
func sigKey(name string) string { return "snapshots/" + name + "/manifest.sig" }

// maxManifest bounds the manifest and signature documents read from a store.
const maxManifest = 1 << 20

// maxConfig bounds a snapshot's config blob.
const maxConfig = 4 << 20

// readObject reads a small object of a store, refusing one over limit bytes.
func readObject(ctx context.Context, st objectstore.Store, key string, limit int64) ([]byte, error) {
	r, err := st.Get(ctx, key, objectstore.Range{})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is over %d bytes: %w", key, limit, errdefs.ErrInvalidArgument)
	}
	return data, nil
}

// readManifest fetches a snapshot's manifest and verified config, without checking its
// signature (listing and removal); restores use verifiedManifest.
func readManifest(ctx context.Context, st objectstore.Store, cas *objectstore.CAS, name string) (ocispec.Manifest, snapshotConfig, error) {
	data, err := readObject(ctx, st, manifestKey(name), maxManifest)
	if err != nil {
		return ocispec.Manifest{}, snapshotConfig{}, fmt.Errorf("snapshot %q: %w", name, err)
	}
	return parseManifest(ctx, cas, name, data)
}

// verifiedManifest is readManifest for a restore: the manifest's signature is checked
// against the trusted keys first, so nothing the manifest names (not even the config blob)
// is fetched unless a trusted key signed it.
func verifiedManifest(ctx context.Context, st objectstore.Store, cas *objectstore.CAS, name string, v *snapsign.Verifier) (ocispec.Manifest, snapshotConfig, error) {
	data, err := readObject(ctx, st, manifestKey(name), maxManifest)
	if err != nil {
		return ocispec.Manifest{}, snapshotConfig{}, fmt.Errorf("snapshot %q: %w", name, err)
	}
	sig, err := readObject(ctx, st, sigKey(name), maxManifest)
	if err != nil && !errdefs.IsNotFound(err) {
		return ocispec.Manifest{}, snapshotConfig{}, fmt.Errorf("snapshot %q signature: %w", name, err)
	}
	fp, err := v.Verify(name, data, sig)
	if err != nil {
		return ocispec.Manifest{}, snapshotConfig{}, err
	}
	log.L(ctx).Debug("snapshot signature verified", "snapshot", name, "key", fp)
	return parseManifest(ctx, cas, name, data)
}

func parseManifest(ctx context.Context, cas *objectstore.CAS, name string, data []byte) (ocispec.Manifest, snapshotConfig, error) {
	var m ocispec.Manifest
	var c snapshotConfig
	err := json.Unmarshal(data, &m)
	if err != nil || m.ArtifactType != ArtifactSnapshot {
		return m, c, fmt.Errorf("snapshot %q: not a DeltaBox snapshot manifest (%v): %w", name, err, errdefs.ErrInvalidArgument)
	}
	if m.Config.Size <= 0 || m.Config.Size > maxConfig {
		return m, c, fmt.Errorf("snapshot %q: config blob of %d bytes: want 1 to %d: %w", name, m.Config.Size, maxConfig, errdefs.ErrInvalidArgument)
	}
	rc, err := cas.Get(ctx, m.Config.Digest)
	if err != nil {
		return m, c, fmt.Errorf("snapshot %q config: %w", name, err)
	}
	defer rc.Close()
	// Read to the end (the CAS reader checks the digest there), one byte past the recorded size.
	data, err = io.ReadAll(io.LimitReader(rc, m.Config.Size+1))
	if err == nil && int64(len(data)) != m.Config.Size {
		err = fmt.Errorf("config blob has %d bytes, the manifest says %d: %w", len(data), m.Config.Size, errdefs.ErrInvalidArgument)
	}
	if err == nil {
		err = json.Unmarshal(data, &c)
	}
	if err != nil {
		return m, c, fmt.Errorf("snapshot %q config: %w", name, err)
	}
	if c.Format != snapshotFormat {
		return m, c, fmt.Errorf("snapshot %q has format %d; this node reads format %d: %w", name, c.Format, snapshotFormat, errdefs.ErrFailedPrecondition)
	}
	return m, c, nil
}

// layerByType finds a manifest layer by media type.
func layerByType(m ocispec.Manifest, mediaType string) (ocispec.Descriptor, error) {
	for _, l := range m.Layers {
		if l.MediaType == mediaType {
			return l, nil
		}
	}
	return ocispec.Descriptor{}, fmt.Errorf("snapshot has no %s blob: %w", mediaType, errdefs.ErrInvalidArgument)
}

// loadSnapshotKeys loads (or creates) the node's signing key and the trusted keys; the
// node's own key is always trusted.
func (o *Orchestrator) loadSnapshotKeys(ctx context.Context) error {
	signer, err := snapsign.LoadOrCreate(o.opts.Snapshots.SigningKey)
	if err != nil {
		return err
	}
	keys, err := snapsign.ParseTrusted(o.opts.Snapshots.TrustedKeys)
	if err != nil {
		return fmt.Errorf("[snapshots] trusted_keys: %w", err)
	}
	o.signer, o.trust = signer, snapsign.NewVerifier(append(keys, signer.Public())...)
	log.L(ctx).Info("snapshot keys", "signing_key", snapsign.Fingerprint(signer.Public()), "trusted", o.trust.Trusted())
	return nil
}

// uncompressedSize is the recorded decompressed size of a zstd blob.
func uncompressedSize(d ocispec.Descriptor) (int64, error) {
	n, err := strconv.ParseInt(d.Annotations[annotationUncompressed], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("blob %s records no valid %s: %w", d.Annotations[annotationTitle], annotationUncompressed, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// boundedReader fails once more than n bytes were read from r: a decompressing reader past
// the size the (signed) manifest recorded.
type boundedReader struct {
	r    io.Reader
	n    int64
	what string
	past string // what reading more than n means ("": "decompresses to more than its recorded size")
}

func (b *boundedReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if b.n < 0 {
		past := b.past
		if past == "" {
			past = "decompresses to more than its recorded size"
		}
		return n, fmt.Errorf("%s %s: %w", b.what, past, errdefs.ErrInvalidArgument)
	}
	return n, err
}
