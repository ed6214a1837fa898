package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// LeaseOnLayer leases a sandbox of the pool whose root filesystem stacks the held fork layer
// req.SharedLower above the image's (forklower.go). When the pool has a ready sandbox that
// qualifies, that one is moved onto the layer (reroot_linux.go: no container, task or
// network is made, its identity is its own); else a new sandbox is created on the layer, as
// with LeaseRestored. ready is called before the layer is first used (it waits until the
// layer is written); prepare gets the sandbox's layout
// with the layer before its root filesystem is mounted with it (it may write into the upper
// dir, e.g. a fresh /etc/machine-id). Warm says which way the sandbox came.
func (m *Manager) LeaseOnLayer(ctx context.Context, poolName string, req LeaseRequest, ready func(context.Context) error, prepare func(Layout) error) (res LeaseResult, warm bool, err error) {
	if req.SharedLower == "" {
		return LeaseResult{}, false, fmt.Errorf("lease on a fork layer without a layer: %w", errdefs.ErrInvalidArgument)
	}
	if m.hasRerootable(poolName) {
		res, err := m.leaseRerooted(ctx, poolName, req, ready, prepare)
		if err == nil || ctx.Err() != nil || !errors.Is(err, errNotReroutable) {
			return res, err == nil, err
		}
		log.L(ctx).Info("no ready sandbox to move onto the fork layer; creating one", "pool", poolName, "reason", err)
	}
	res, err = m.lease(ctx, poolName, req, func(ctx context.Context, c containerd.Container, l Layout, ioc cio.Creator) (containerd.Task, error) {
		if err := ready(ctx); err != nil {
			return nil, err
		}
		if err := prepare(l); err != nil {
			return nil, err
		}
		return StartFresh(ctx, c, l, ioc)
	})
	return res, false, err
}

// hasRerootable says whether pool has a ready sandbox not known to be unfit for a reroot.
func (m *Manager) hasRerootable(poolName string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := m.poolLocked(poolName)
	if err != nil {
		return false
	}
	for _, sb := range p.ready {
		if !sb.noReroot {
			return true
		}
	}
	return false
}

// takeRerootable pops a ready sandbox of pool not known to be unfit for a reroot.
func (m *Manager) takeRerootable(poolName string) (*sandbox, *pool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := m.poolLocked(poolName)
	if err != nil {
		return nil, nil, err
	}
	for i, sb := range p.ready {
		if sb.noReroot {
			continue
		}
		p.ready = append(p.ready[:i:i], p.ready[i+1:]...)
		p.leased++
		p.lastLease = time.Now()
		return sb, p, nil
	}
	return nil, nil, fmt.Errorf("pool %q has no ready sandbox to move onto a fork layer: %w", poolName, errNotReroutable)
}

// leaseRerooted takes a ready sandbox, moves it onto the layer and leases it. A sandbox found
// unfit goes back to the pool (marked); one whose move failed is destroyed. Both answer
// errNotReroutable (the caller creates one instead). What needs containerd (the container's
// label, its snapshot's mounts) is done before ready returns, while the layer is written;
// the pool's refill is poked only once the sandbox moved (its creates' CPU would slow the
// layer's writing and the other forks' moves).
func (m *Manager) leaseRerooted(ctx context.Context, poolName string, req LeaseRequest, ready func(context.Context) error, prepare func(Layout) error) (LeaseResult, error) {
	start := time.Now()
	if err := ValidateEnv(req.Env); err != nil {
		return LeaseResult{}, err
	}
	if !m.forkLowerHeld(req.SharedLower) {
		return LeaseResult{}, fmt.Errorf("shared layer %s is not a held fork layer: %w", req.SharedLower, errdefs.ErrInvalidArgument)
	}
	sb, p, err := m.takeRerootable(poolName)
	if err != nil {
		return LeaseResult{}, err
	}
	defer p.poke()
	spans, moving, err := m.rerootOnto(ctx, sb, req.SharedLower, ready, prepare)
	if err != nil && !moving { // unfit, untouched
		if errors.Is(err, errNotReroutable) {
			sb.noReroot = true
		}
		m.giveBack(p, sb)
		return LeaseResult{}, fmt.Errorf("ready sandbox %s: %w: %w", sb.rec.CID, errNotReroutable, err)
	}
	if err != nil {
		m.mu.Lock()
		p.leased--
		m.mu.Unlock()
		m.destroy(context.WithoutCancel(ctx), sb)
		if ctx.Err() != nil {
			return LeaseResult{}, err
		}
		log.L(ctx).Warn("move a ready sandbox onto a fork layer (destroyed)", "container", sb.rec.CID, "error", err)
		return LeaseResult{}, fmt.Errorf("%w: %w", errNotReroutable, err)
	}
	res, err := m.recordLease(ctx, p, sb, req, false, start)
	if err == nil {
		log.L(ctx).Info("ready sandbox moved onto a fork layer", append([]any{"sandbox", res.ID, "container", sb.rec.CID,
			"layer", req.SharedLower, "ms", msSince(start)}, spans...)...)
	}
	return res, err
}

// rerootOnto moves sb's init onto a root filesystem stacking the fork layer dir; its
// layout, container label and root fd follow. It returns the spans of the move (log fields),
// and whether it changed the sandbox before it failed (moving: the caller destroys it; else
// the sandbox is as it was).
func (m *Manager) rerootOnto(ctx context.Context, sb *sandbox, dir string, ready func(context.Context) error, prepare func(Layout) error) (_ []any, moving bool, _ error) {
	var sp spans
	sp.start()
	if err := rerootable(sb.inst); err != nil {
		return nil, false, err
	}
	l := sb.inst.layout
	if l.Folded != "" {
		return nil, false, fmt.Errorf("sandbox %s already stacks a fork layer: %w", sb.rec.CID, errNotReroutable)
	}
	if want, err := forkLowerPath(l.Upper, filepath.Base(dir)); err != nil || want != dir {
		return nil, false, fmt.Errorf("fork layer %s is not next to the snapshots of %s (%s): %w", dir, sb.rec.CID, l.Upper, errNotReroutable)
	}
	l.Folded, l.Lower = dir, append([]string{dir}, l.Lower...)
	c, err := m.rt.client.LoadContainer(ctx, sb.rec.CID)
	if err != nil {
		return nil, false, fmt.Errorf("load container %s: %w", sb.rec.CID, err)
	}
	mounts, err := m.rt.stackedMounts(ctx, c, dir)
	if err != nil {
		return nil, false, err
	}
	if err := indexOff(mounts); err != nil {
		return nil, false, err
	}
	sp.mark("check")
	// The label before the move: a daemon restarted from here on finds the layer used and
	// the container's root filesystem stacking it (layoutOf).
	if _, err := c.SetLabels(ctx, map[string]string{LabelForkLower: filepath.Base(dir)}); err != nil {
		return nil, true, fmt.Errorf("label container %s with its fork layer: %w", sb.rec.CID, err)
	}
	sp.mark("label")
	if err := ready(ctx); err != nil {
		return nil, true, err
	}
	sp.mark("wait_layer")
	if err := prepare(l); err != nil {
		return nil, true, err
	}
	sp.mark("prepare")
	if err := reroot(sb.inst, mounts, m.rt.dir, &sp); err != nil {
		return nil, true, fmt.Errorf("move sandbox %s onto fork layer %s: %w", sb.rec.CID, dir, err)
	}
	m.mu.Lock()
	sb.inst.layout = l
	m.mu.Unlock()
	return sp.fields(), true, nil
}

// forkLowerHeld says whether dir is a fork layer held by NewForkLower or HoldForkLower.
func (m *Manager) forkLowerHeld(dir string) bool {
	m.flMu.Lock()
	defer m.flMu.Unlock()
	return m.flPins[dir] > 0
}

// recordLease records sb, taken from p, as leased with req's late-bound settings.
func (m *Manager) recordLease(ctx context.Context, p *pool, sb *sandbox, req LeaseRequest, cold bool, start time.Time) (LeaseResult, error) {
	lease := &Lease{ID: newID("sb-"), Env: req.Env, Labels: maps.Clone(req.Labels), LeasedAt: time.Now().UTC(),
		EgressPolicy: req.EgressPolicy, RestoredFrom: req.RestoredFrom, ForkedFrom: req.ForkedFrom}
	rec := sb.rec
	rec.Lease = lease
	if err := m.st.put(bucketContainers, rec.CID, rec); err != nil {
		if sb.inst.layout.Folded != "" { // never a warm sandbox of the pool
			m.mu.Lock()
			p.leased--
			m.mu.Unlock()
			m.destroy(ctx, sb)
		} else {
			m.giveBack(p, sb)
		}
		return LeaseResult{}, stateRootFull(fmt.Errorf("record lease: %w", err))
	}
	m.mu.Lock()
	sb.rec = rec
	m.leased[lease.ID] = sb
	m.mu.Unlock()
	m.metrics.observeLease(p.t.Name, cold, time.Since(start))
	log.L(ctx).Info("sandbox leased", "sandbox", lease.ID, "pool", p.t.Name, "container", rec.CID, "cold", cold)
	return LeaseResult{Sandbox: m.view(p, sb), Cold: cold}, nil
}

// spans times the steps of an operation for its log line: name_ms per step.
type spans struct {
	last time.Time
	kv   []any
}

func (s *spans) start() { s.last = time.Now() }

// mark ends the step name.
func (s *spans) mark(name string) {
	now := time.Now()
	s.kv = append(s.kv, name+"_ms", msOf(now.Sub(s.last)))
	s.last = now
}

func (s *spans) fields() []any { return s.kv }

func msSince(t time.Time) float64 { return msOf(time.Since(t)) }

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
