package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"strings"
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
	if ck.Images != "" {
		if t, err := o.pools.Template(sb.Pool); err == nil && !t.NoUserNamespace {
			return nil, fmt.Errorf("checkpoint %s holds processes, restored by CRIU, which needs a pool without user namespaces (pool %q has one): %w",
				ck.ID, sb.Pool, errdefs.ErrFailedPrecondition)
		}
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

// forkTask is the pool's RestoreFunc of forkProcesses.
func (o *Orchestrator) forkTask(s *session, ck ckptRecord) pool.RestoreFunc {
	images := filepath.Join(ck.Images, "images")
	return func(ctx context.Context, c containerd.Container, layout pool.Layout, ioc cio.Creator) (containerd.Task, error) {
		conf, err := criu.ConfigOf(ctx, c)
		if err != nil {
			return nil, err
		}
		if err := writeNewIdentityConfig(conf, images); err != nil {
			return nil, err
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(s.fs.Export(ctx, ck.ID, pw)) }()
		err = overlay.Import(ctx, pr, layout.Upper, overlay.WithOverlayWhiteouts())
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
