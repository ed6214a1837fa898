package pool

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// Claim is what a source other than the pool database says about a container: that a lease
// owns it (the orchestrator's session directory of that lease names the container).
type Claim struct {
	Lease Lease
	Pool  string
}

// Quarantined is a sandbox kept after a start because what the pool database says about it
// cannot be trusted: it is not leasable and nothing acts on it until the operator adopts or
// destroys it.
type Quarantined struct {
	ID        string    `json:"id"` // the lease ID when known, else the container ID
	Pool      string    `json:"pool,omitempty"`
	Container string    `json:"container"`
	Created   time.Time `json:"created"`
	LeasedAt  time.Time `json:"leased_at"`
	Reason    string    `json:"reason"`
	lease     *Lease
}

// quarantineContainer keeps container c out of the pools, with the reason.
func (m *Manager) quarantineContainer(ctx context.Context, c containerd.Container, f found, why string) {
	q := &Quarantined{ID: c.ID(), Container: c.ID(), Reason: why}
	if f.recorded && f.bad == "" {
		q.Pool, q.Created, q.lease = f.rec.Pool, f.rec.Created, f.rec.Lease
	}
	if f.claimed { // the session directory's word outranks a record that is in doubt
		l := f.claim.Lease
		q.lease, q.Pool = &l, f.claim.Pool
	}
	if q.lease != nil {
		q.ID, q.LeasedAt = q.lease.ID, q.lease.LeasedAt
	}
	if q.Created.IsZero() {
		if info, err := c.Info(ctx); err == nil {
			q.Created = info.CreatedAt
		}
	}
	m.quarantine[q.ID] = q
	log.L(ctx).Error("sandbox quarantined: its record cannot be trusted; adopt or destroy it",
		"sandbox", q.ID, "container", q.Container, "pool", q.Pool, "reason", why)
}

// Quarantined lists the quarantined sandboxes, by ID.
func (m *Manager) Quarantined() []Quarantined {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Quarantined, 0, len(m.quarantine))
	for _, q := range m.quarantine {
		out = append(out, *q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// IsQuarantined reports whether id (a lease or container ID) is quarantined.
func (m *Manager) IsQuarantined(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.findQuarantined(id)
	return ok
}

func (m *Manager) findQuarantined(id string) (*Quarantined, bool) {
	if q, ok := m.quarantine[id]; ok {
		return q, true
	}
	for _, q := range m.quarantine {
		if q.Container == id {
			return q, true
		}
	}
	return nil, false
}

// Adopt makes quarantined sandbox id leased again, in pool poolName ("" keeps the pool it
// was known by), under its lease ID (a new one when none is known). The container must be
// running with an init that answers; its record is written anew.
func (m *Manager) Adopt(ctx context.Context, id, poolName string) (Sandbox, error) {
	m.mu.Lock()
	q, ok := m.findQuarantined(id)
	if !ok {
		m.mu.Unlock()
		return Sandbox{}, fmt.Errorf("sandbox %q is not quarantined: %w", id, errdefs.ErrNotFound)
	}
	if poolName == "" {
		poolName = q.Pool
	}
	p := m.pools[poolName]
	m.mu.Unlock()
	if p == nil {
		return Sandbox{}, fmt.Errorf("adopt %s: pool %q does not exist (create it, or name another with --pool): %w",
			id, poolName, errdefs.ErrFailedPrecondition)
	}
	c, err := m.rt.client.LoadContainer(ctx, q.Container)
	if err != nil {
		return Sandbox{}, fmt.Errorf("adopt %s: load container %s: %w", id, q.Container, err)
	}
	inst, err := m.probe(ctx, c)
	if err != nil {
		return Sandbox{}, fmt.Errorf("adopt %s: container %s: %w", id, q.Container, err)
	}
	rec := record{CID: q.Container, Pool: poolName, Created: q.Created, Lease: adoptedLease(q)}
	return m.finishAdopt(ctx, q, p, rec, inst)
}

// adoptedLease is the lease an adopted sandbox gets: the one known, else a new one under the
// quarantined ID when that is a lease ID.
func adoptedLease(q *Quarantined) *Lease {
	if q.lease != nil {
		l := *q.lease
		return &l
	}
	id := q.ID
	if !strings.HasPrefix(id, "sb-") {
		id = newID("sb-")
	}
	return &Lease{ID: id, LeasedAt: time.Now().UTC()}
}

func (m *Manager) finishAdopt(ctx context.Context, q *Quarantined, p *pool, rec record, inst *instance) (Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.quarantine[q.ID]; !ok || cur != q || m.pools[p.t.Name] != p {
		return Sandbox{}, fmt.Errorf("adopt %s: changed meanwhile: %w", q.ID, errdefs.ErrConflict)
	}
	if _, taken := m.leased[rec.Lease.ID]; taken {
		return Sandbox{}, fmt.Errorf("adopt %s: lease %s is in use: %w", q.ID, rec.Lease.ID, errdefs.ErrAlreadyExists)
	}
	if err := m.st.put(bucketContainers, rec.CID, rec); err != nil {
		return Sandbox{}, fmt.Errorf("adopt %s: record: %w", q.ID, err)
	}
	delete(m.quarantine, q.ID)
	sb := &sandbox{rec: rec, inst: inst}
	m.watch(sb, inst.ref.Load())
	p.leased++
	m.leased[rec.Lease.ID] = sb
	log.L(ctx).Info("quarantined sandbox adopted", "sandbox", rec.Lease.ID, "container", rec.CID, "pool", p.t.Name)
	return m.view(p, sb), nil
}

// DestroyQuarantined destroys quarantined sandbox id: its container, network and record. It
// returns the lease ID it was known by (for the caller's own state).
func (m *Manager) DestroyQuarantined(ctx context.Context, id string) (string, error) {
	m.mu.Lock()
	q, ok := m.findQuarantined(id)
	m.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("sandbox %q is not quarantined: %w", id, errdefs.ErrNotFound)
	}
	if err := m.rt.destroy(ctx, q.Container); err != nil {
		return "", fmt.Errorf("destroy quarantined sandbox %s: %w", id, err)
	}
	if err := m.st.delete(bucketContainers, q.Container); err != nil {
		return "", fmt.Errorf("forget quarantined sandbox %s: %w", id, err)
	}
	m.mu.Lock()
	delete(m.quarantine, q.ID)
	m.mu.Unlock()
	log.L(ctx).Info("quarantined sandbox destroyed", "sandbox", q.ID, "container", q.Container)
	return q.ID, nil
}
