package orchestrator

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/snapsign"
	"github.com/deltabox/deltabox/pool"
)

// restoreFixture is a signed snapshot in a file:// store and an orchestrator that trusts it.
type restoreFixture struct {
	o     *Orchestrator
	store objectstore.Store
	src   snapshotSource
	pages []byte // the CRIU images' pages-1.img
}

func newRestoreFixture(t *testing.T) *restoreFixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	status := criu.Status{Available: true, Version: 40101}
	pages := bytes.Repeat([]byte("page"), 1<<18)
	if err := os.MkdirAll(images, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := criu.WriteMeta(images, criu.LocalMeta(status)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(images, "pages-1.img"), pages, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := snapshotConfig{Format: snapshotFormat, Sandbox: "sb-1", Checkpoint: "3", Image: "img", Template: pool.Template{Name: "p"}}
	var blobs []blob
	add := func(media, title string, compress bool, write func(io.Writer) error) {
		b, err := stageBlob(dir, media, title, compress, write)
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, b)
	}
	add(MediaCRIUImages, "criu-images.tar.zst", false, func(w io.Writer) (err error) {
		cfg.CRIU, err = criu.Pack(ctx, images, w)
		return err
	})
	add(MediaRootfsDiff, "rootfs.tar.zst", true, func(w io.Writer) error {
		tw := tar.NewWriter(w)
		_ = tw.WriteHeader(&tar.Header{Name: "root/", Typeflag: tar.TypeDir, Mode: 0o700})
		return tw.Close()
	})
	add(MediaStateDocument, "state.json.zst", true, jsonBlob(map[string]int{"step": 3}))
	add(MediaConfig, "config.json", false, jsonBlob(&cfg))
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := t.TempDir()
	st, err := objectstore.Open(ctx, "file://"+storeDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := uploadSnapshot(ctx, st, snapsign.NewSigner(key), "sb-1-3", blobs, cfg, func(api.Progress) {}); err != nil {
		t.Fatal(err)
	}
	o := &Orchestrator{opts: Options{Root: t.TempDir(), ObjectStoreURI: "file://" + storeDir}, criu: status, trust: snapsign.NewVerifier(pub)}
	if os.Geteuid() == 0 { // as the daemon does: stage in memory (restore_area.go)
		o.restores = restoreArea{root: o.opts.Root, limit: 64 << 20}
		t.Cleanup(func() { _ = o.restores.close() })
	}
	src, err := o.openSnapshot(ctx, "sb-1-3")
	if err != nil {
		t.Fatal(err)
	}
	return &restoreFixture{o: o, store: st, src: src, pages: pages}
}

// corrupt replaces the blob titled title with other bytes of the same size.
func (fx *restoreFixture) corrupt(t *testing.T, title string) {
	t.Helper()
	fx.rewrite(t, title, func(data []byte) []byte { data[len(data)/2] ^= 0xff; return data })
}

// rewrite replaces the stored blob titled title with what change makes of it.
func (fx *restoreFixture) rewrite(t *testing.T, title string, change func([]byte) []byte) {
	t.Helper()
	ctx := context.Background()
	for _, d := range fx.src.m.Layers {
		if d.Annotations[annotationTitle] != title {
			continue
		}
		key, err := fx.src.cas.Key(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		r, err := fx.store.Get(ctx, key, objectstore.Range{})
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(r)
		r.Close()
		data = change(data)
		if err := fx.store.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no blob %s", title)
}

// restoreLeftovers lists what the restore left in its temp dirs (on disk and in memory)
// and fails if it kept any of the tmpfs reserved.
func (fx *restoreFixture) restoreLeftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	for _, sub := range []string{restoreDiskDir, restoreMemDir} {
		entries, err := os.ReadDir(filepath.Join(fx.o.opts.Root, sub))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range entries {
			left = append(left, sub+"/"+e.Name())
		}
	}
	fx.o.restores.mu.Lock()
	defer fx.o.restores.mu.Unlock()
	if fx.o.restores.reserved != 0 {
		t.Errorf("the restore ended with %d bytes of the tmpfs still reserved", fx.o.restores.reserved)
	}
	return left
}

// fakeRestorePool stands for pool.Manager.LeaseRestored: create stands for the container,
// spec and disk work before the task starts; then it "creates" the container, starts the
// task with the RestoreFunc and, if that fails, removes the container as the pool's
// cleanup does.
type fakeRestorePool struct {
	create     func(ctx context.Context) error
	spec       *specs.Spec
	mu         sync.Mutex
	containers map[string]bool // created, not removed
}

type fakeContainer struct {
	containerd.Container // nil: only ID and Spec are called
	id                   string
	spec                 *specs.Spec
}

func (c fakeContainer) ID() string                              { return c.id }
func (c fakeContainer) Spec(context.Context) (*oci.Spec, error) { return c.spec, nil }

func (p *fakeRestorePool) LeaseRestored(ctx context.Context, poolName string, req pool.LeaseRequest, restore pool.RestoreFunc) (pool.LeaseResult, error) {
	if err := p.create(ctx); err != nil {
		return pool.LeaseResult{}, err
	}
	p.mu.Lock()
	if p.containers == nil {
		p.containers = map[string]bool{}
	}
	p.containers["dbx-1"] = true
	p.mu.Unlock()
	if _, err := restore(ctx, fakeContainer{id: "dbx-1", spec: p.spec}, pool.Layout{}, cio.NullIO); err != nil {
		p.mu.Lock()
		delete(p.containers, "dbx-1")
		p.mu.Unlock()
		return pool.LeaseResult{}, err
	}
	return pool.LeaseResult{Sandbox: pool.Sandbox{ID: "sb-new", Pool: poolName}}, nil
}

func (p *fakeRestorePool) left() int { p.mu.Lock(); defer p.mu.Unlock(); return len(p.containers) }

// blockingEmit blocks the download at its first progress event (the end of the CRIU
// images blob) until unblock is closed, and signals downloading when it gets there.
type blockingEmit struct {
	downloading, unblock chan struct{}
	once                 sync.Once
	mu                   sync.Mutex
	phases               []string
}

func newBlockingEmit() *blockingEmit {
	return &blockingEmit{downloading: make(chan struct{}), unblock: make(chan struct{})}
}

func (e *blockingEmit) emit(p api.Progress) {
	e.mu.Lock()
	e.phases = append(e.phases, p.Phase)
	e.mu.Unlock()
	if p.Phase == "download" {
		e.once.Do(func() { close(e.downloading); <-e.unblock })
	}
}

// TestRestoreDownloadsBesideCreate: the blobs download while the pool creates the sandbox
// (the create sees the download under way, not done), and the task gets them only once all
// are there and verified.
func TestRestoreDownloadsBesideCreate(t *testing.T) {
	fx := newRestoreFixture(t)
	ctx := context.Background()
	em := newBlockingEmit()
	dl, err := fx.o.startDownload(ctx, fx.src, em.emit)
	if err != nil {
		t.Fatal(err)
	}
	defer dl.close()
	p := &fakeRestorePool{create: func(context.Context) error {
		select {
		case <-em.downloading:
		case <-time.After(10 * time.Second):
			return errors.New("the download did not run during the create")
		}
		select {
		case <-dl.done:
			return errors.New("the download finished before the create let it go on")
		default:
		}
		close(em.unblock)
		return nil
	}}
	var got *fetched
	task := func(ctx context.Context, c containerd.Container, _ pool.Layout, _ cio.Creator) (containerd.Task, error) {
		f, err := dl.wait(ctx)
		got = f
		return nil, err
	}
	res, f, err := leaseRestored(ctx, p, dl, restoreTarget{pool: "p"}, task)
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != "sb-new" || f != got || f == nil {
		t.Fatalf("lease %+v, fetched %p, the task's %p", res, f, got)
	}
	if data, err := os.ReadFile(filepath.Join(f.images, "pages-1.img")); err != nil || !bytes.Equal(data, fx.pages) {
		t.Fatalf("the task's images: %d bytes, %v; want the snapshot's %d", len(data), err, len(fx.pages))
	}
	if string(f.state) == "" || f.rootfsSize <= 0 {
		t.Fatalf("state %q, rootfs size %d: the download was not complete", f.state, f.rootfsSize)
	}
	if os.Geteuid() == 0 { // staged in memory, on the restores' tmpfs
		var st unix.Statfs_t
		if err := unix.Statfs(f.images, &st); err != nil || st.Type != unix.TMPFS_MAGIC ||
			filepath.Dir(f.dir) != filepath.Join(fx.o.opts.Root, restoreMemDir) {
			t.Fatalf("the images are in %s (fs %#x, %v), want them on the tmpfs %s", f.images, st.Type, err, restoreMemDir)
		}
	}
	dl.close()
	if left := fx.restoreLeftovers(t); len(left) != 0 {
		t.Fatalf("the restore's temp dir is left: %v", left)
	}
}

// TestRestoreCorruptBlobBesideCreate: a CRIU images blob that does not match its digest
// fails the restore's task (the real restoreTask) with the digest named, before anything
// uses the images (no CRIU config is written); the pool removes the container and close
// removes the temp dir.
func TestRestoreCorruptBlobBesideCreate(t *testing.T) {
	fx := newRestoreFixture(t)
	fx.corrupt(t, "criu-images.tar.zst")
	ctx := context.Background()
	conf := filepath.Join(t.TempDir(), "criu.conf")
	var phases []string
	var mu sync.Mutex
	emit := func(p api.Progress) { mu.Lock(); phases = append(phases, p.Phase); mu.Unlock() }
	dl, err := fx.o.startDownload(ctx, fx.src, emit)
	if err != nil {
		t.Fatal(err)
	}
	p := &fakeRestorePool{create: func(context.Context) error { return nil },
		spec: &specs.Spec{Annotations: map[string]string{criu.ConfigAnnotation: conf}}}
	_, _, err = leaseRestored(ctx, p, dl, restoreTarget{pool: "p"}, fx.o.restoreTask(dl, emit))
	dl.close()
	d, _ := layerByType(fx.src.m, MediaCRIUImages)
	if err == nil || !strings.Contains(err.Error(), d.Digest.String()) || !strings.Contains(err.Error(), "restore snapshot sb-1-3") {
		t.Fatalf("restore of a corrupt CRIU images blob: %v; want the restore's error naming %s", err, d.Digest)
	}
	if !errors.Is(err, objectstore.ErrDigestMismatch) && !errdefs.IsInvalidArgument(err) {
		t.Errorf("restore of a corrupt blob: %v, want a digest mismatch or a refused archive", err)
	}
	if _, err := os.Stat(conf); !os.IsNotExist(err) {
		t.Errorf("the task went past the download (CRIU config written: %v)", err)
	}
	if n := p.left(); n != 0 {
		t.Errorf("%d containers left behind", n)
	}
	if left := fx.restoreLeftovers(t); len(left) != 0 {
		t.Errorf("the restore's temp dir is left: %v", left)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ph := range phases {
		if ph == "restore" {
			t.Errorf("progress %v: a restore phase without the snapshot", phases)
		}
	}
}

// TestRestoreRefusesABlobLongerThanItsManifest: a store that sends more of a blob than the
// signed manifest's size (here 32 MiB more, as a stream that never ends would) fails the
// download as soon as the size is passed, naming the blob, before its digest is checked at
// its end, and leaves nothing staged.
func TestRestoreRefusesABlobLongerThanItsManifest(t *testing.T) {
	fx := newRestoreFixture(t)
	fx.rewrite(t, "rootfs.tar.zst", func(data []byte) []byte { return append(data, make([]byte, 32<<20)...) })
	dl, err := fx.o.startDownload(context.Background(), fx.src, func(api.Progress) {})
	if err != nil {
		t.Fatal(err)
	}
	_, err = dl.wait(context.Background())
	dl.close()
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "blob rootfs.tar.zst is longer than the manifest says") {
		t.Fatalf("download of a blob longer than its manifest: %v, want invalid_argument naming it", err)
	}
	if errors.Is(err, objectstore.ErrDigestMismatch) {
		t.Errorf("the length was caught by the digest at the end, not by the size: %v", err)
	}
	if left := fx.restoreLeftovers(t); len(left) != 0 {
		t.Errorf("the restore's temp dir is left: %v", left)
	}
}

// TestRestoreFailedCreateStopsDownload: a create that fails while the blobs download stops
// the download (close cancels it, waits for it, removes its dir), and a cancelled request
// stops both.
func TestRestoreFailedCreateStopsDownload(t *testing.T) {
	for _, cancelled := range []bool{false, true} {
		fx := newRestoreFixture(t)
		ctx, cancel := context.WithCancel(context.Background())
		em := newBlockingEmit()
		dl, err := fx.o.startDownload(ctx, fx.src, em.emit)
		if err != nil {
			t.Fatal(err)
		}
		failed := errors.New("create container: no space left")
		p := &fakeRestorePool{create: func(ctx context.Context) error {
			<-em.downloading
			if cancelled {
				cancel()
				return ctx.Err()
			}
			return failed
		}}
		_, _, err = leaseRestored(ctx, p, dl, restoreTarget{pool: "p"}, func(context.Context, containerd.Container, pool.Layout, cio.Creator) (containerd.Task, error) {
			t.Error("the task started after a failed create")
			return nil, nil
		})
		if want := map[bool]error{false: failed, true: context.Canceled}[cancelled]; !errors.Is(err, want) {
			t.Fatalf("cancelled=%v: restore: %v, want %v", cancelled, err, want)
		}
		go func() { <-dl.ctx.Done(); close(em.unblock) }() // the download goes on only once stopped
		dl.close()
		if !errors.Is(dl.err, context.Canceled) {
			t.Errorf("cancelled=%v: the download ended with %v, want it stopped", cancelled, dl.err)
		}
		if left := fx.restoreLeftovers(t); len(left) != 0 {
			t.Errorf("cancelled=%v: the restore's temp dir is left: %v", cancelled, left)
		}
		cancel()
	}
}
