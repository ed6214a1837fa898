package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// seedEnv is the environment variable a fork's execs get: a fresh random seed per fork, so
// that agents seeding their PRNG from it diverge on purpose.
const seedEnv = "DELTABOX_SEED"

// ForkFrom makes req.Count sandboxes on this node from checkpoint req.From of sandbox id,
// without a snapshot: each is a warm sandbox of the source's pool (its own ID, address and
// machine ID) whose files are made the checkpoint's through its merged mount (only the
// checkpoint's upper state and the warm sandbox's own upper entries are visited: the image is
// not copied), whose agent state is the checkpoint's document and whose execs get a fresh
// DELTABOX_SEED. It is labelled forked_from=ID@CKPT. Processes start fresh, unless the
// checkpoint holds them (L3): then each fork is a new container whose task CRIU restores from
// the checkpoint's images with a new identity (forkProcesses). The effect journal starts
// empty: the source's held effects stay the source's to commit or drop, never sent twice.
func (o *Orchestrator) ForkFrom(ctx context.Context, id string, req api.SnapshotRequest, emit Emit) ([]api.Lease, error) {
	if req.Count < 1 || req.Count > 64 {
		return nil, fmt.Errorf("fork count %d: want 1 to 64: %w", req.Count, errdefs.ErrInvalidArgument)
	}
	if req.To != "" || req.KeepSnapshot {
		return nil, fmt.Errorf("a fork from a checkpoint pushes no snapshot (to, keep_snapshot): %w", errdefs.ErrInvalidArgument)
	}
	s, err := o.session(ctx, id)
	if err != nil {
		return nil, err
	}
	sb, err := o.pools.Get(id)
	if err != nil {
		return nil, err
	}
	ref := req.From
	if owner, rest, ok := strings.Cut(ref, "@"); ok && owner != "" { // ID@CKPT, as forked_from names it
		if owner != id {
			return nil, fmt.Errorf("fork of sandbox %q from %q, a checkpoint of another sandbox: refused: %w", id, ref, errdefs.ErrInvalidArgument)
		}
		ref = rest
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, err := s.resolve(ref)
	if err != nil {
		return nil, err
	}
	ck := s.ckpts[i]
	doc, err := s.stateAt(i, "")
	if err != nil {
		return nil, err
	}
	target, err := o.forkInto(sb, ck.ID)
	if err != nil {
		return nil, err
	}
	if ck.Images == "" {
		leases, err := o.forkShared(ctx, s, sb, ck, target, doc, req, emit)
		if !errdefs.IsNotImplemented(err) {
			return leases, err
		}
		log.L(ctx).Warn("fork without a shared layer (files written into each fork)", "sandbox", id, "error", err)
	}
	var leases []api.Lease
	for n := range req.Count {
		emit(api.Progress{Phase: "fork", Done: int64(n), Total: int64(req.Count)})
		fork := o.forkOne
		if ck.Images != "" { // an L3 checkpoint holds its processes: CRIU restores them
			fork = o.forkProcesses
		}
		l, err := fork(ctx, s, ck, target, doc, req.Replay)
		if err != nil {
			return leases, fmt.Errorf("fork %d of %d from %s@%s: %w", n+1, req.Count, id, ck.ID, err)
		}
		leases = append(leases, l)
	}
	emit(api.Progress{Phase: "fork", Done: int64(req.Count), Total: int64(req.Count)})
	return leases, nil
}

// forkShared forks from a checkpoint without processes: the checkpoint's files are written
// once as an overlay layer (overlay.Store.WriteLower, in the sandbox's own ids) that every
// fork stacks read-only above the image with an empty upper dir of its own
// (pool.LeaseRequest.SharedLower), so neither the image nor the checkpoint's files are copied
// per fork; the forks are made concurrently. The layer is removed with its last fork; until
// then a later fork of the same checkpoint stacks it too instead of writing another. A pool
// whose snapshots are not overlay snapshot dirs answers not_implemented (the caller writes
// the files into each fork instead). s.mu is read-held.
func (o *Orchestrator) forkShared(ctx context.Context, s *session, sb pool.Sandbox, ck ckptRecord, to restoreTarget, doc []byte, req api.SnapshotRequest, emit Emit) ([]api.Lease, error) {
	start := time.Now()
	if dir, ok := o.heldForkLayer(s, ck.ID); ok { // forks of this checkpoint still run on it
		defer o.pools.ReleaseForkLower(context.WithoutCancel(ctx), dir)
		layer := &sharedLayer{dir: dir, done: make(chan struct{})}
		close(layer.done)
		log.L(ctx).Info("fork on the shared layer of earlier forks", "sandbox", s.id, "checkpoint", ck.ID, "layer", dir)
		return o.forkOnShared(ctx, s, ck, to, doc, req, emit, layer, start)
	}
	size, err := s.fs.LowerSize(ck.ID)
	if err != nil {
		return nil, err
	}
	dir, err := o.pools.NewForkLower(ctx, sb, size)
	if err != nil {
		return nil, err
	}
	defer o.pools.ReleaseForkLower(context.WithoutCancel(ctx), dir)
	// The layer is written while the forks' containers are made; each waits for it before
	// its task mounts the root filesystem.
	layer := &sharedLayer{dir: dir, done: make(chan struct{})}
	go func() {
		defer close(layer.done)
		written, err := s.fs.WriteLower(ctx, ck.ID, overlay.LowerRequest{Dir: dir})
		if err != nil {
			layer.err = fmt.Errorf("write checkpoint %s as a shared layer: %w", ck.ID, err)
			return
		}
		log.L(ctx).Info("checkpoint written as a shared fork layer", "sandbox", s.id, "checkpoint", ck.ID, "layer", dir,
			"entries", written.Entries, "bytes", written.Bytes, "ms", ms(time.Since(start)))
		s.forkLayersMu.Lock() // complete: later forks of the checkpoint may use it
		if s.forkLayers == nil {
			s.forkLayers = map[string]string{}
		}
		s.forkLayers[ck.ID] = dir
		s.forkLayersMu.Unlock()
	}()
	defer func() { <-layer.done }() // before the layer is released
	return o.forkOnShared(ctx, s, ck, to, doc, req, emit, layer, start)
}

// heldForkLayer returns the layer an earlier fork of checkpoint ckpt wrote, held again,
// while it exists.
func (o *Orchestrator) heldForkLayer(s *session, ckpt string) (string, bool) {
	s.forkLayersMu.Lock()
	defer s.forkLayersMu.Unlock()
	dir, ok := s.forkLayers[ckpt]
	if !ok {
		return "", false
	}
	if !o.pools.HoldForkLower(dir) {
		delete(s.forkLayers, ckpt)
		return "", false
	}
	return dir, true
}

// forkOnShared makes req.Count forks on layer concurrently. s.mu is read-held.
func (o *Orchestrator) forkOnShared(ctx context.Context, s *session, ck ckptRecord, to restoreTarget, doc []byte, req api.SnapshotRequest, emit Emit, layer *sharedLayer, start time.Time) ([]api.Lease, error) {
	var (
		mu     sync.Mutex
		done   int64
		wg     sync.WaitGroup
		leases = make([]api.Lease, req.Count)
		errs   = make([]error, req.Count)
	)
	emit(api.Progress{Phase: "fork", Done: 0, Total: int64(req.Count)})
	for n := range req.Count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[n], errs[n] = o.forkOnLayer(ctx, s, ck, to, doc, req.Replay, layer, start)
			mu.Lock()
			done++
			emit(api.Progress{Phase: "fork", Done: done, Total: int64(req.Count)})
			mu.Unlock()
		}()
	}
	wg.Wait()
	<-layer.done
	if layer.err != nil {
		return nil, layer.err
	}
	var out []api.Lease
	var first error
	for n := range req.Count {
		if errs[n] != nil {
			if first == nil {
				first = fmt.Errorf("fork %d of %d from %s@%s: %w", n+1, req.Count, s.id, ck.ID, errs[n])
			}
			continue
		}
		out = append(out, leases[n])
	}
	return out, first
}

// forkOnLayer makes one fork on the shared layer dir: a new sandbox of the pool (its own ID,
// address, user namespace range and, when the image or checkpoint has one, /etc/machine-id)
// whose files are the layer's. Its LeaseMS counts from the start of the fork call (the
// layer's writing included). s.mu is read-held.
func (o *Orchestrator) forkOnLayer(ctx context.Context, s *session, ck ckptRecord, to restoreTarget, doc []byte, replay bool, layer *sharedLayer, start time.Time) (api.Lease, error) {
	lr := to.lease
	lr.Env = append(append([]string(nil), lr.Env...), seedEnv+"="+newSeed())
	lr.SharedLower = layer.dir
	ready := func(ctx context.Context) error {
		select {
		case <-layer.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		return layer.err
	}
	prepare := func(layout pool.Layout) error { return freshMachineID(layout) }
	res, warm, err := o.pools.LeaseOnLayer(ctx, to.pool, lr, ready, prepare)
	if err != nil {
		return api.Lease{}, err
	}
	leased := time.Since(start)
	if o.proxy != nil {
		o.proxy.CopyRecordings(s.id, res.ID, replay)
	}
	o.startSessionWith(ctx, res.Sandbox, &sessionSeed{state: doc, message: to.message})
	log.L(ctx).Info("sandbox forked from a checkpoint on a shared layer", "sandbox", res.ID, "from", s.id,
		"checkpoint", ck.ID, "layer", layer.dir, "warm", warm, "leased_ms", ms(leased), "ms", ms(time.Since(start)))
	return api.Lease{LeaseResult: apiLeaseResult(res), LeaseMS: ms(time.Since(start))}, nil
}

// sharedLayer is a fork layer being written: done is closed once it is (err says how).
type sharedLayer struct {
	dir  string
	done chan struct{}
	err  error
}

// forkOne leases one warm sandbox and makes it the checkpoint's. s.mu is read-held.
func (o *Orchestrator) forkOne(ctx context.Context, s *session, ck ckptRecord, to restoreTarget, doc []byte, replay bool) (api.Lease, error) {
	start, ckpt := time.Now(), ck.ID
	lr := to.lease
	lr.Env = append(append([]string(nil), lr.Env...), seedEnv+"="+newSeed())
	res, err := o.pools.Lease(ctx, to.pool, lr)
	if err != nil {
		return api.Lease{}, err
	}
	if err := o.forkFiles(ctx, s, ckpt, res.Sandbox); err != nil {
		if rerr := o.Release(context.WithoutCancel(ctx), res.ID); rerr != nil {
			log.L(ctx).Warn("release a fork that failed", "sandbox", res.ID, "error", rerr)
		}
		return api.Lease{}, err
	}
	if o.proxy != nil {
		o.proxy.CopyRecordings(s.id, res.ID, replay)
	}
	o.startSessionWith(ctx, res.Sandbox, &sessionSeed{state: doc, message: to.message})
	log.L(ctx).Info("sandbox forked from a checkpoint", "sandbox", res.ID, "from", s.id, "checkpoint", ckpt,
		"ms", ms(time.Since(start)))
	return api.Lease{LeaseResult: apiLeaseResult(res), LeaseMS: ms(time.Since(start))}, nil
}

// forkProcesses forks from an L3 checkpoint: a new container of the pool whose upper dir gets
// the checkpoint's files (exported from the layer store, the image not copied) and whose task
// is restored by CRIU from the checkpoint's images with a new identity, as a snapshot restore
// does, without pushing or fetching anything. s.mu is read-held.
func (o *Orchestrator) forkProcesses(ctx context.Context, s *session, ck ckptRecord, to restoreTarget, doc []byte, replay bool) (api.Lease, error) {
	start := time.Now()
	lr := to.lease
	lr.Env = append(append([]string(nil), lr.Env...), seedEnv+"="+newSeed())
	res, err := o.pools.LeaseRestored(ctx, to.pool, lr, o.forkTask(s, ck))
	if err != nil {
		return api.Lease{}, err
	}
	if o.proxy != nil {
		o.proxy.CopyRecordings(s.id, res.ID, replay)
	}
	o.startSessionWith(ctx, res.Sandbox, &sessionSeed{state: doc, message: to.message})
	log.L(ctx).Info("sandbox forked from a checkpoint with its processes", "sandbox", res.ID, "from", s.id,
		"checkpoint", ck.ID, "ms", ms(time.Since(start)))
	return api.Lease{LeaseResult: apiLeaseResult(res), LeaseMS: ms(time.Since(start))}, nil
}

// forkTask is the pool's RestoreFunc of forkProcesses. Each fork restores from its own
// hard-linked copy of the checkpoint's images (its user namespace is moved into the fork's id
// range; the checkpoint's own images stay as they are).
func (o *Orchestrator) forkTask(s *session, ck ckptRecord) pool.RestoreFunc {
	return func(ctx context.Context, c containerd.Container, layout pool.Layout, ioc cio.Creator) (containerd.Task, error) {
		work, err := os.MkdirTemp(filepath.Join(o.opts.Root, "criu-work"), "fork-"+c.ID()+"-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(work)
		images := filepath.Join(work, "images")
		if err := criu.LinkImages(filepath.Join(ck.Images, "images"), images); err != nil {
			return nil, fmt.Errorf("images of checkpoint %s: %w", ck.ID, err)
		}
		conf, err := criu.ConfigOf(ctx, c)
		if err != nil {
			return nil, err
		}
		if err := o.writeNewIdentityConfig(conf, images); err != nil {
			return nil, err
		}
		ids, err := intoUserNS(ctx, c, images)
		if err != nil {
			return nil, err
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(s.fs.Export(ctx, ck.ID, pw)) }()
		err = overlay.Import(ctx, pr, layout.Upper, append(ids, overlay.WithOverlayWhiteouts())...)
		pr.CloseWithError(err)
		if err != nil {
			return nil, fmt.Errorf("write the files of checkpoint %s: %w", ck.ID, err)
		}
		if err := freshMachineID(layout); err != nil {
			return nil, err
		}
		return o.restoreWithTimeout(ctx, c.ID(), images, ioc)
	}
}

// forkFiles writes checkpoint ckpt's files into the new sandbox through its merged mount.
func (o *Orchestrator) forkFiles(ctx context.Context, s *session, ckpt string, sb pool.Sandbox) error {
	root, err := sb.OpenRoot()
	if err != nil {
		return err
	}
	defer root.Close()
	req := overlay.RollbackRequest{Merged: pool.FDPath(root), Upper: sb.Layout.Upper, Lower: sb.Layout.Lower}
	if m := sb.Isolation.IDMapping; m != nil {
		req.IDs = &overlay.IDRange{Host: m.HostID, Size: m.Size}
	}
	_, err = s.fs.RestoreInto(ctx, ckpt, req)
	if err != nil {
		return fmt.Errorf("write the files of checkpoint %s: %w", ckpt, err)
	}
	return nil
}

// newSeed returns 16 random hex digits.
func newSeed() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
