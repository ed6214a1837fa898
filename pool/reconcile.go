package pool

import (
	"context"
	"errors"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/pool/initproto"
)

// reconcile rebuilds the in-memory pools after a start: recorded pools come back, healthy
// recorded sandboxes return to their pool (ready) or stay leased under the same ID, and
// containers that are broken or orphaned are destroyed. The database is not trusted blindly:
// a container whose record is damaged, whose leased record names a pool that is gone, or that
// has no record but is claimed by a lease (Options.Claims) is quarantined, never destroyed.
func (m *Manager) reconcile(ctx context.Context) error {
	if m.st.damage != "" {
		log.L(ctx).Error("pool database damaged: sandboxes without a trusted record are quarantined", "detail", m.st.damage)
	}
	templates, badPools, err := loadAll[Template](m.st, bucketPools)
	if err != nil {
		return err
	}
	for _, b := range badPools {
		log.L(ctx).Error("pool template damaged: the pool is not restored, its leased sandboxes are quarantined", "pool", b.Key, "reason", b.Reason)
	}
	for _, t := range templates {
		m.addPool(t)
	}
	byCID, bad, err := m.loadRecords(ctx)
	if err != nil {
		return err
	}
	var claims map[string]Claim
	if m.opts.Claims != nil {
		claims = m.opts.Claims(ctx)
	}
	filter := fmt.Sprintf(`labels.%q==%s`, LabelNode, m.opts.Node)
	containers, err := m.rt.client.Containers(ctx, filter)
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	for _, c := range containers {
		m.rt.claimIDs(ctx, c)
		rec, ok := byCID[c.ID()]
		delete(byCID, c.ID())
		claim, claimed := claims[c.ID()]
		m.adopt(ctx, c, found{rec: rec, recorded: ok, bad: bad[c.ID()], claim: claim, claimed: claimed})
		delete(bad, c.ID())
	}
	if err := m.reconcileNetwork(ctx); err != nil {
		return err
	}
	for cid := range byCID { // recorded, but containerd has no such container
		log.L(ctx).Warn("forgetting sandbox whose container is gone", "container", cid)
		_ = m.st.delete(bucketContainers, cid)
		_ = m.rt.destroy(ctx, cid)
	}
	for cid, why := range bad { // damaged, and no container to keep
		log.L(ctx).Warn("dropping damaged record of a container that is gone", "container", cid, "reason", why)
		_ = m.st.delete(bucketContainers, cid)
	}
	// Disks of containers deleted behind the daemon's back would stay mounted for good.
	if err := UnmountDisks(m.rt.dir, func(cid string) bool {
		_, err := m.rt.client.LoadContainer(ctx, cid)
		return err == nil
	}); err != nil {
		log.L(ctx).Warn("unmount disks of vanished sandboxes", "error", err)
	}
	if err := ReserveDisks(m.rt.dir); err != nil {
		log.L(ctx).Warn("reserve the sandbox disks (a full state root may fail their writeback)", "error", err)
	}
	m.rt.unpinOrphanUserNS(ctx)
	m.pruneForkLowers(ctx)
	if err := m.rt.ids.prune(m.rt.dir); err != nil {
		log.L(ctx).Warn("drop the user namespace ranges of vanished sandboxes from the host registry", "error", err)
	}
	return nil
}

// loadRecords returns the sandbox records that check, by container ID, and the reasons the
// others do not (a record stored under another container's key is damaged too).
func (m *Manager) loadRecords(ctx context.Context) (map[string]record, map[string]string, error) {
	recs, badRecs, err := loadAll[record](m.st, bucketContainers)
	if err != nil {
		return nil, nil, err
	}
	byCID := make(map[string]record, len(recs))
	bad := map[string]string{}
	for _, b := range badRecs {
		bad[b.Key] = b.Reason
	}
	for _, r := range recs {
		byCID[r.CID] = r
	}
	return byCID, bad, nil
}

// found is what reconcile knows about one container.
type found struct {
	rec      record
	recorded bool
	bad      string // why its record is damaged ("" when it is not)
	claim    Claim
	claimed  bool
}

// adopt takes one existing container back, quarantines it, or destroys it.
func (m *Manager) adopt(ctx context.Context, c containerd.Container, f found) {
	if why := m.suspect(f); why != "" {
		m.quarantineContainer(ctx, c, f, why)
		return
	}
	rec, p := f.rec, m.pools[f.rec.Pool]
	reason := ""
	var inst *instance
	switch {
	case !f.recorded:
		reason = "no record"
	case rec.Destroying:
		reason = "an earlier destroy failed"
	case p == nil:
		reason = "pool " + rec.Pool + " is gone"
	default:
		var err error
		if inst, err = m.probe(ctx, c); err != nil {
			if rec.Lease != nil && !errors.Is(err, errTaskGone) {
				// Its processes run: a network record gone missing or an init that does
				// not answer is no reason to throw the user's work away.
				m.quarantineContainer(ctx, c, f, "leased, but it could not be taken back at start: "+err.Error())
				return
			}
			reason = err.Error()
		} else if rec.Lease == nil && inst.layout.Folded != "" {
			inst.ref.Load().retire()
			reason = "a fork on a shared layer that is not leased (never reused)"
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

// suspect says why a container must be quarantined rather than adopted or destroyed ("" when
// its record can be acted on): its record is damaged, it is leased (by its record or by a
// claim) but its pool is gone, it is claimed by a lease its record does not name, or it is
// claimed and has no record at all.
func (m *Manager) suspect(f found) string {
	switch {
	case f.bad != "":
		return f.bad
	case !f.recorded && f.claimed:
		return fmt.Sprintf("no record in the pool database, but lease %s (session directory) names this container", f.claim.Lease.ID)
	case !f.recorded, f.rec.Destroying: // a tombstone: its lease was released
		return ""
	case f.claimed && (f.rec.Lease == nil || f.rec.Lease.ID != f.claim.Lease.ID):
		return fmt.Sprintf("its record says %s, but lease %s (session directory) names this container", leaseOf(f.rec), f.claim.Lease.ID)
	case m.pools[f.rec.Pool] == nil && (f.rec.Lease != nil || f.claimed):
		return fmt.Sprintf("leased, but its pool %q is not in the pool database", f.rec.Pool)
	}
	return ""
}

func leaseOf(r record) string {
	if r.Lease == nil {
		return "it is not leased"
	}
	return "lease " + r.Lease.ID
}

// errTaskGone is a probe's answer for a container whose task is not running: nothing of it
// runs, so even a leased one is destroyed at start.
var errTaskGone = errors.New("task not running")

// probe checks that a container's task runs and its init answers.
func (m *Manager) probe(ctx context.Context, c containerd.Container) (*instance, error) {
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%w: no task: %w", errTaskGone, err)
	}
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
	if err == nil && st.Status == containerd.Stopped { // its init exited while no daemon ran
		return nil, fmt.Errorf("%w (stopped, exit status %d): %w", errTaskGone, st.ExitStatus, errdefs.ErrFailedPrecondition)
	}
	if err != nil || st.Status != containerd.Running {
		return nil, fmt.Errorf("%w (%s, %v): %w", errTaskGone, st.Status, err, errdefs.ErrFailedPrecondition)
	}
	inst := m.rt.newInstance(c.ID(), task.Pid())
	if inst.layout, err = m.rt.layoutOf(ctx, c); err != nil {
		return nil, err
	}
	if inst.ids, err = idsOf(ctx, c); err != nil {
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
		// A daemon that died during an L3 dump leaves the init parked (its listener
		// closed, initproto.UnparkSignal): unpark it and ask again.
		if uerr := task.Kill(ctx, initproto.UnparkSignal); uerr == nil {
			err = pingUnparked(ctx, inst)
		}
		if err != nil {
			inst.ref.Load().retire()
			return nil, fmt.Errorf("init does not answer: %w", err)
		}
	}
	return inst, nil
}

// pingUnparked pings an init just sent initproto.UnparkSignal until it listens again.
func pingUnparked(ctx context.Context, inst *instance) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := ping(ctx, inst)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	for _, q := range m.quarantine {
		keep[q.Container] = true
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
