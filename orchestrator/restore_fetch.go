package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// snapshotSource is a snapshot whose signed manifest and config were verified: enough to
// choose where it is restored (restoreInto) and to download its blobs (startDownload).
type snapshotSource struct {
	uri  string // STORE#NAME
	name string
	cas  *objectstore.CAS
	m    ocispec.Manifest
	cfg  snapshotConfig
}

// openSnapshot verifies a snapshot's manifest signature and config, and that this node's
// CRIU can restore it; nothing is downloaded or written yet.
func (o *Orchestrator) openSnapshot(ctx context.Context, uri string) (snapshotSource, error) {
	storeURI, name, err := parseSnapshotURI(uri, o.opts.ObjectStoreURI)
	if err != nil {
		return snapshotSource{}, err
	}
	st, _, err := o.openStore(ctx, storeURI)
	if err != nil {
		return snapshotSource{}, err
	}
	cas := objectstore.NewCAS(st)
	m, cfg, err := verifiedManifest(ctx, st, cas, name, o.trust)
	if err != nil {
		return snapshotSource{}, err
	}
	if err := criu.CheckCompatible(cfg.CRIU, o.criu); err != nil {
		return snapshotSource{}, fmt.Errorf("snapshot %s: %w", uri, err)
	}
	if err := failpoint.Inject("restore/verified"); err != nil {
		return snapshotSource{}, err
	}
	return snapshotSource{uri: storeURI + "#" + name, name: name, cas: cas, m: m, cfg: cfg}, nil
}

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

// download is a snapshot's blobs on their way into a private temp dir, in the background:
// a restore downloads them while the pool creates the sandbox's container, spec and disk,
// and its task waits for them (wait) before anything of them is used. Only the download
// goroutine emits progress until wait returns, so emit is never called concurrently.
type download struct {
	f      *fetched        // cfg, uri and paths at once; the rest once done is closed
	ctx    context.Context // the download's own, cancelled by close
	cancel context.CancelFunc
	done   chan struct{}
	staged func() // gives the staging's room back (restoreArea.stage)
	err    error  // set before done is closed
}

// startDownload makes the restore's temp dir and starts downloading src's blobs into it,
// every blob verified against its digest; the caller must close the download.
func (o *Orchestrator) startDownload(ctx context.Context, src snapshotSource, emit Emit) (*download, error) {
	base, staged := o.restores.stage(ctx, src.stagedBytes())
	if err := os.MkdirAll(base, 0o700); err != nil {
		staged()
		return nil, err
	}
	dir, err := os.MkdirTemp(base, src.name+"-")
	if err != nil {
		staged()
		return nil, err
	}
	f := &fetched{dir: dir, cfg: src.cfg, uri: src.uri, images: filepath.Join(dir, "images"), rootfs: filepath.Join(dir, "rootfs.tar.zst")}
	ctx, cancel := context.WithCancel(ctx)
	d := &download{f: f, ctx: ctx, cancel: cancel, done: make(chan struct{}), staged: staged}
	go func() {
		defer close(d.done)
		start := time.Now()
		if d.err = f.download(d.ctx, src.cas, src.m, emit); d.err == nil {
			d.err = failpoint.Inject("restore/fetched")
		}
		log.L(d.ctx).Debug("snapshot fetched", "uri", f.uri, "duration", time.Since(start), "dir", dir, "error", d.err)
	}()
	return d, nil
}

// wait returns the downloaded snapshot once every blob of it is verified, or why not; a
// finished download answers even when ctx is done.
func (d *download) wait(ctx context.Context) (*fetched, error) {
	select {
	case <-d.done:
	default:
		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the download of snapshot %s: %w", d.f.uri, ctx.Err())
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	return d.f, nil
}

// close stops the download if it still runs, waits for its goroutine (which emits no
// more progress then) and removes the temp dir.
func (d *download) close() {
	d.cancel()
	<-d.done
	if err := os.RemoveAll(d.f.dir); err != nil {
		log.L(context.Background()).Warn("remove a restore's temp dir", "path", d.f.dir, "error", err)
	}
	d.staged()
}

// stagedBytes bounds what a restore of src writes to its staging: the CRIU images unpacked
// (each file rounded up to a page, as a tmpfs stores it) and every blob of the manifest as
// downloaded (the images' own blob included, which is not staged: an overestimate).
func (src snapshotSource) stagedBytes() int64 {
	n := src.cfg.CRIU.UnpackedBytes + int64(src.cfg.CRIU.Entries)*4096
	for _, l := range src.m.Layers {
		n += l.Size
	}
	return n
}

// download fetches the blobs in the order a restore uses them: the CRIU images, the rootfs
// diff, the held effects (when there are some), the state document.
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
// before its blob does, at a zstd frame trailer or padding). A cancelled ctx stops it
// before the blob is opened, whatever the store does with ctx.
func fetch(ctx context.Context, cas *objectstore.CAS, d ocispec.Descriptor, emit Emit, consume func(io.Reader) error) error {
	title := d.Annotations[annotationTitle]
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("download %s: %w", title, err)
	}
	r, err := cas.Get(ctx, d.Digest)
	if err != nil {
		return fmt.Errorf("download %s: %w", title, err)
	}
	defer r.Close()
	// No more than the signed manifest's size of it, whatever the store sends: a stream that
	// does not end would otherwise fill the staging (and, in memory, starve the restores
	// beside it) before its digest could be checked at its end.
	sized := &boundedReader{r: r, n: d.Size, what: "blob " + title, past: "is longer than the manifest says"}
	pr := &progressReader{r: sized, emit: emit, p: api.Progress{Phase: "download", Blob: title, Total: d.Size}}
	if err := consume(pr); err != nil {
		return fmt.Errorf("download %s (%s): %w", title, d.Digest, err)
	}
	if _, err := io.Copy(io.Discard, pr); err != nil {
		return fmt.Errorf("download %s (%s): %w", title, d.Digest, err)
	}
	emit(api.Progress{Phase: "download", Blob: title, Done: d.Size, Total: d.Size})
	return nil
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
