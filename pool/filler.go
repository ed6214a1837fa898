package pool

import (
	"context"
	"fmt"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

// fillInterval is how often a filler re-checks its pool without being poked.
const fillInterval = 2 * time.Second

// A warm lease is answered in ~2 ms, but the create that refills its slot costs the host
// 100+ ms of CPU (containerd, runc, the shim, the init, the disk) and slows whatever runs
// next on a small host: the caller's next step (a `deltabox exec` or `lease` process
// starting, the next lease of a batch; issue 19, docs/benchmarks.md). So while the pool still
// has a ready sandbox, the filler waits until no warm lease came for refillQuiet, and at most
// refillMaxDefer, before it creates; an empty pool is refilled at once (its next lease would
// be cold).
const (
	refillQuiet    = 25 * time.Millisecond
	refillMaxDefer = 250 * time.Millisecond
)

func (m *Manager) startFiller(p *pool) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.fill(p)
	}()
}

// fill keeps p at min_ready ready sandboxes (bounded by max) until the pool is removed or
// the manager closes.
func (m *Manager) fill(p *pool) {
	ctx := log.With(m.ctx, "pool", p.t.Name)
	tick := time.NewTicker(fillInterval)
	defer tick.Stop()
	for {
		m.mu.Lock()
		failures := p.failures
		m.mu.Unlock()
		if !waitBackoff(ctx, p, failures) || !m.waitQuiet(ctx, p) {
			return
		}
		for range m.reserve(p) {
			m.wg.Add(1)
			go m.fillOne(ctx, p)
		}
		select {
		case <-p.kick:
		case <-tick.C:
		case <-p.stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

// waitQuiet returns once p has had no warm lease for refillQuiet, it has no ready sandbox
// left, or refillMaxDefer has passed (see refillQuiet); false when the pool or the manager
// stops first.
func (m *Manager) waitQuiet(ctx context.Context, p *pool) bool {
	deadline := time.Now().Add(refillMaxDefer)
	for {
		m.mu.Lock()
		wait := min(time.Until(p.lastLease.Add(refillQuiet)), time.Until(deadline))
		empty := len(p.ready) == 0
		m.mu.Unlock()
		if wait <= 0 || empty {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.kick: // another lease (or a release): look again
			t.Stop()
		case <-p.stop:
			t.Stop()
			return false
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// reserve counts the sandboxes p is missing and marks them as being created.
func (m *Manager) reserve(p *pool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return 0
	}
	n := min(p.t.MinReady-len(p.ready)-p.creating, p.t.Max-p.total())
	if n <= 0 {
		return 0
	}
	p.creating += n
	return n
}

// fillOne creates one warm sandbox for p (creating was already counted by reserve).
func (m *Manager) fillOne(ctx context.Context, p *pool) {
	defer m.wg.Done()
	sb, err := m.create(ctx, p)
	m.mu.Lock()
	defer m.mu.Unlock()
	p.creating--
	if err != nil {
		p.failures++
		log.L(ctx).Error("create warm sandbox", "error", err, "failures", p.failures)
		p.poke()
		return
	}
	p.failures = 0
	if m.pools[p.t.Name] != p || m.closing {
		go m.destroy(context.WithoutCancel(ctx), sb)
		return
	}
	p.ready = append(p.ready, sb)
}

// create makes, starts and records one sandbox of p, bounded by the create semaphore.
func (m *Manager) create(ctx context.Context, p *pool) (*sandbox, error) {
	return m.createWith(ctx, p, nil, "")
}

// createWith is create with a custom task start (a restore; nil starts a fresh init) and
// optionally a shared fork layer above the image.
func (m *Manager) createWith(ctx context.Context, p *pool, restore RestoreFunc, forkLower string) (*sandbox, error) {
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-m.sem }()
	start := time.Now()
	t := p.t
	cid := newID("dbx-")
	inst, err := m.rt.create(ctx, &t, cid, restore, forkLower)
	if err != nil {
		return nil, err
	}
	sb := &sandbox{rec: record{CID: cid, Pool: t.Name, Created: time.Now().UTC()}, inst: inst}
	if err := m.st.put(bucketContainers, cid, sb.rec); err != nil {
		inst.ref.Load().retire()
		m.rt.cleanup(ctx, cid)
		return nil, stateRootFull(fmt.Errorf("record sandbox %s: %w", cid, err))
	}
	m.watch(sb, inst.ref.Load())
	log.L(ctx).Info("sandbox created", "container", cid, "ms", time.Since(start).Milliseconds())
	return sb, nil
}
