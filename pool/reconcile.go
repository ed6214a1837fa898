package pool

import (
	"context"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// reconcile rebuilds the in-memory pools after a start: recorded pools come back, healthy
// recorded sandboxes return to their pool (ready) or stay leased under the same ID, and
// containers that are broken, orphaned or unrecorded are destroyed.
func (m *Manager) reconcile(ctx context.Context) error {
	templates, err := loadAll[Template](m.st, bucketPools)
	if err != nil {
		return err
	}
	for _, t := range templates {
		m.addPool(t)
	}
	recs, err := loadAll[record](m.st, bucketContainers)
	if err != nil {
		return err
	}
	byCID := make(map[string]record, len(recs))
	for _, r := range recs {
		byCID[r.CID] = r
	}
	filter := fmt.Sprintf(`labels.%q==%s`, LabelNode, m.opts.Node)
	containers, err := m.rt.client.Containers(ctx, filter)
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	for _, c := range containers {
		rec, ok := byCID[c.ID()]
		delete(byCID, c.ID())
		m.adopt(ctx, c, rec, ok)
	}
	if err := m.reconcileNetwork(ctx); err != nil {
		return err
	}
	for cid := range byCID { // recorded, but containerd has no such container
		log.L(ctx).Warn("forgetting sandbox whose container is gone", "container", cid)
		_ = m.st.delete(bucketContainers, cid)
		_ = m.rt.destroy(ctx, cid)
	}
	return nil
}

// adopt takes one existing container back, or destroys it.
func (m *Manager) adopt(ctx context.Context, c containerd.Container, rec record, recorded bool) {
	p := m.pools[rec.Pool]
	reason := ""
	var inst *instance
	switch {
	case !recorded:
		reason = "no record"
	case rec.Destroying:
		reason = "an earlier destroy failed"
	case p == nil:
		reason = "pool " + rec.Pool + " is gone"
	default:
		var err error
		if inst, err = m.probe(ctx, c); err != nil {
			reason = err.Error()
		}
	}
	if reason != "" {
		log.L(ctx).Warn("destroying sandbox on restart", "container", c.ID(), "reason", reason, "leased", rec.Lease != nil)
		if err := m.rt.destroy(ctx, c.ID()); err == nil {
			_ = m.st.delete(bucketContainers, c.ID())
		}
		return
	}
	sb := &sandbox{rec: rec, inst: inst}
	m.watch(sb, inst.ref.Load())
	if rec.Lease != nil {
		p.leased++
		m.leased[rec.Lease.ID] = sb
	} else {
		p.ready = append(p.ready, sb)
	}
	log.L(ctx).Info("sandbox adopted", "container", c.ID(), "pool", rec.Pool, "leased", rec.Lease != nil)
}

// probe checks that a container's task runs and its init answers.
func (m *Manager) probe(ctx context.Context, c containerd.Container) (*instance, error) {
	task, err := c.Task(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("no task: %w", err)
	}
	st, err := task.Status(ctx)
	if err == nil && st.Status == containerd.Paused {
		// A daemon that died mid-checkpoint leaves the sandbox frozen: thaw it.
		log.L(ctx).Warn("resuming a sandbox left frozen", "container", c.ID())
		if err = task.Resume(ctx); err == nil {
			st, err = task.Status(ctx)
		}
	}
	if err != nil || st.Status != containerd.Running {
		return nil, fmt.Errorf("task not running (%s, %v): %w", st.Status, err, errdefs.ErrFailedPrecondition)
	}
	inst := m.rt.newInstance(c.ID(), task.Pid())
	if inst.layout, err = m.rt.layoutOf(ctx, c); err != nil {
		return nil, err
	}
	if m.rt.net != nil {
		att, err := m.rt.net.Lookup(ctx, c.ID())
		if err != nil {
			return nil, fmt.Errorf("network: %w", err)
		}
		inst.ip = att.IP
	}
	// A daemon that died mid-checkpoint leaves the cgroup frozen behind containerd's back.
	if err := NewFreezer(inst.layout.Cgroup).Thaw(); err != nil {
		return nil, err
	}
	if err := inst.attach(); err != nil {
		return nil, err
	}
	if err := ping(ctx, inst); err != nil {
		inst.ref.Load().retire()
		return nil, fmt.Errorf("init does not answer: %w", err)
	}
	return inst, nil
}

func ping(ctx context.Context, inst *instance) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := inst.init.Ping(ctx)
	return err
}

// reconcileNetwork removes network namespaces of containers this node no longer has.
func (m *Manager) reconcileNetwork(ctx context.Context) error {
	if m.rt.net == nil {
		return nil
	}
	keep := map[string]bool{}
	for _, p := range m.pools {
		for _, sb := range p.ready {
			keep[sb.rec.CID] = true
		}
	}
	for _, sb := range m.leased {
		keep[sb.rec.CID] = true
	}
	removed, err := m.rt.net.Reconcile(ctx, func(id string) bool { return keep[id] })
	if len(removed) > 0 {
		log.L(ctx).Info("removed leftover sandbox networks", "ids", removed)
	}
	if err != nil { // leftovers must not keep the node from starting
		log.L(ctx).Warn("could not remove every leftover sandbox network", "error", err)
	}
	return nil
}
