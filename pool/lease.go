package pool

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/pool/initproto"
)

// LeaseRequest holds the late-bound settings of a lease.
type LeaseRequest struct {
	Env          []string
	Labels       map[string]string
	EgressPolicy string // overrides the template's (YAML); validated by the caller
	RestoredFrom string // the snapshot a restored sandbox came from (recorded, shown)
	ForkedFrom   string // the sandbox and checkpoint a fork came from (recorded, shown)
	// SharedLower, a layer of NewForkLower (held), makes the sandbox a new container whose
	// root filesystem stacks that layer above the image's with an empty upper dir of its own
	// (forklower.go). It is destroyed on release, never reused.
	SharedLower string
}

// Sandbox is the public view of a leased sandbox.
type Sandbox struct {
	ID        string            `json:"id"`
	Pool      string            `json:"pool"`
	Container string            `json:"container"`
	Image     string            `json:"image"`
	Env       []string          `json:"env,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	LeasedAt  time.Time         `json:"leased_at"`
	Created   time.Time         `json:"created"`
	InitPid   uint32            `json:"init_pid"`
	IP        string            `json:"ip,omitempty"`
	// EgressPolicy is the lease's egress policy, or the template's.
	EgressPolicy string `json:"egress_policy,omitempty"`
	RestoredFrom string `json:"restored_from,omitempty"` // see LeaseRequest
	ForkedFrom   string `json:"forked_from,omitempty"`
	// State is "leased", or "failed" once the sandbox was fenced (its init exited; Reason
	// says why): every call on it fails until it is released. Quarantined lists the others.
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Limits and Isolation are what confines the sandbox (its pool's, see PoolInfo).
	Limits    Limits    `json:"limits"`
	Isolation Isolation `json:"isolation"`
	RunDir    string    `json:"-"`
	Layout    Layout    `json:"-"`
	initc     *initproto.Client
	ref       *initRef
}

// OpenRoot opens the sandbox's root directory (its merged filesystem, as its init sees it)
// through the fd the pool took when the init started, never by pid: a pid can be reused,
// the fd cannot. The file is O_PATH; use it as a directory fd or through FDPath, and close
// it after the operation (a held root must not outlive a task replacement). It fails with
// failed_precondition once the sandbox failed or its init was replaced.
func (s Sandbox) OpenRoot() (*os.File, error) {
	if s.ref == nil {
		return nil, fmt.Errorf("sandbox %q has no attached init: %w", s.ID, errdefs.ErrFailedPrecondition)
	}
	f, err := s.ref.openRoot()
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", s.ID, err)
	}
	return f, nil
}

// Init returns the client of the sandbox's init. It checks that the socket's server is the
// init (SO_PEERCRED against the pid held by pidfd): never dial the run directory's init.sock
// with a client of one's own.
func (s Sandbox) Init() *initproto.Client { return s.initc }

// SignalInit sends sig to the sandbox's init through its pidfd, never by pid number (a pid
// is reused once the init exits).
func (s Sandbox) SignalInit(sig syscall.Signal) error {
	if s.ref == nil {
		return fmt.Errorf("sandbox %q has no attached init: %w", s.ID, errdefs.ErrFailedPrecondition)
	}
	if err := s.ref.signal(sig); err != nil {
		return fmt.Errorf("sandbox %q: %w", s.ID, err)
	}
	return nil
}

// Usable returns nil while the sandbox's init runs; a failed_precondition error naming why
// once the sandbox was fenced (its init exited). A Sandbox not made by the pool (a zero
// value in tests) has nothing to fence and is usable.
func (s Sandbox) Usable() error {
	if s.ref == nil {
		return nil
	}
	if err := s.ref.usable(); err != nil {
		return fmt.Errorf("sandbox %q: %w", s.ID, err)
	}
	return nil
}

// LeaseResult is what Lease returns.
type LeaseResult struct {
	Sandbox
	Cold bool `json:"cold"`
}

// Lease takes a ready sandbox from the pool (O(1)), or creates one when the pool is empty and
// below max (a cold lease), and binds the request's env and labels to it.
func (m *Manager) Lease(ctx context.Context, poolName string, req LeaseRequest) (LeaseResult, error) {
	return m.lease(ctx, poolName, req, nil)
}

// LeaseRestored creates a new sandbox of the pool whose task is started by restore (a CRIU
// restore under a new identity: new container, cgroup, network and lease ID) and leases it.
func (m *Manager) LeaseRestored(ctx context.Context, poolName string, req LeaseRequest, restore RestoreFunc) (LeaseResult, error) {
	return m.lease(ctx, poolName, req, restore)
}

func (m *Manager) lease(ctx context.Context, poolName string, req LeaseRequest, restore RestoreFunc) (LeaseResult, error) {
	start := time.Now()
	if err := ValidateEnv(req.Env); err != nil {
		return LeaseResult{}, err
	}
	if req.SharedLower != "" {
		if !m.forkLowerHeld(req.SharedLower) {
			return LeaseResult{}, fmt.Errorf("shared layer %s is not a held fork layer: %w", req.SharedLower, errdefs.ErrInvalidArgument)
		}
	}
	sb, p, cold, err := m.take(poolName, restore != nil || req.SharedLower != "")
	if err != nil {
		return LeaseResult{}, err
	}
	p.poke()
	if cold {
		if sb, err = m.createCold(ctx, p, restore, req.SharedLower); err != nil {
			return LeaseResult{}, err
		}
	}
	return m.recordLease(ctx, p, sb, req, cold, start)
}

// take pops a ready sandbox of poolName, or reserves a slot for a cold create (sb == nil),
// which a restore always needs.
func (m *Manager) take(poolName string, fresh bool) (*sandbox, *pool, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := m.poolLocked(poolName)
	if err != nil {
		return nil, nil, false, err
	}
	if len(p.ready) > 0 && !fresh {
		sb := p.ready[0]
		p.ready[0] = nil
		p.ready = p.ready[1:]
		p.leased++
		p.lastLease = time.Now()
		return sb, p, false, nil
	}
	if p.total() >= p.t.Max {
		return nil, nil, false, fmt.Errorf("pool %q is empty and at its max of %d sandboxes: %w", poolName, p.t.Max, errdefs.ErrUnavailable)
	}
	p.leased++
	return nil, p, true, nil
}

func (m *Manager) createCold(ctx context.Context, p *pool, restore RestoreFunc, forkLower string) (*sandbox, error) {
	sb, err := m.createWith(ctx, p, restore, forkLower)
	if err != nil {
		m.mu.Lock()
		p.leased--
		m.mu.Unlock()
		return nil, fmt.Errorf("cold lease from pool %q: %w", p.t.Name, err)
	}
	return sb, nil
}

// giveBack undoes take for a sandbox whose lease could not be recorded.
func (m *Manager) giveBack(p *pool, sb *sandbox) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p.leased--
	p.ready = append([]*sandbox{sb}, p.ready...)
}

// Release ends a lease: it kills every process but init and resets the sandbox for reuse
// (or destroys it when the pool is over size, it is unhealthy or no Reset is configured).
func (m *Manager) Release(ctx context.Context, id string) error {
	m.mu.Lock()
	sb, ok := m.leased[id]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	delete(m.leased, id)
	p := m.pools[sb.rec.Pool]
	view := m.view(p, sb)
	m.mu.Unlock()
	reused := m.recycle(ctx, p, sb, view)
	log.L(ctx).Info("sandbox released", "sandbox", id, "pool", sb.rec.Pool, "container", sb.rec.CID, "reused", reused)
	return nil
}

// recycle puts a released sandbox back as ready when it can be reset, else destroys it.
func (m *Manager) recycle(ctx context.Context, p *pool, sb *sandbox, view Sandbox) bool {
	reusable := m.opts.Reset != nil && sb.inst.layout.Folded == "" && view.Usable() == nil && m.resetSandbox(ctx, sb, view) == nil
	m.mu.Lock()
	p.leased--
	if reusable && m.pools[p.t.Name] == p && len(p.ready)+p.creating < p.t.MinReady {
		sb.rec.Lease = nil
		if err := m.st.put(bucketContainers, sb.rec.CID, sb.rec); err == nil {
			p.ready = append(p.ready, sb)
			m.mu.Unlock()
			return true
		}
	}
	m.mu.Unlock()
	p.poke()
	m.destroy(ctx, sb)
	return false
}

func (m *Manager) resetSandbox(ctx context.Context, sb *sandbox, view Sandbox) error {
	if err := m.killForRelease(ctx, sb); err != nil {
		log.L(ctx).Warn("kill processes on release", "container", sb.rec.CID, "error", err)
		return err
	}
	if err := m.scrubTenant(ctx, sb); err != nil {
		log.L(ctx).Warn("remove the tenant's residue on release; the sandbox is not reused", "container", sb.rec.CID, "error", err)
		return err
	}
	if err := m.opts.Reset(ctx, view); err != nil {
		log.L(ctx).Warn("reset sandbox on release", "container", sb.rec.CID, "error", err)
		return err
	}
	return nil
}

// Get returns a leased sandbox by ID.
func (m *Manager) Get(id string) (Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.leased[id]
	if !ok {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return m.view(m.pools[sb.rec.Pool], sb), nil
}

// List returns the leased sandboxes, oldest lease first.
func (m *Manager) List() []Sandbox {
	m.mu.Lock()
	out := make([]Sandbox, 0, len(m.leased))
	for _, sb := range m.leased {
		out = append(out, m.view(m.pools[sb.rec.Pool], sb))
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].LeasedAt.Before(out[j].LeasedAt) })
	return out
}

// view builds the public view of a leased sandbox; p may be nil for a removed pool.
func (m *Manager) view(p *pool, sb *sandbox) Sandbox {
	v := Sandbox{Pool: sb.rec.Pool, Container: sb.rec.CID, Created: sb.rec.Created, State: "leased",
		RunDir: sb.inst.runDir, Layout: sb.inst.layout, initc: sb.inst.init, ref: sb.inst.ref.Load()}
	if v.ref != nil {
		v.InitPid = v.ref.pid
		if why := v.ref.failure(); why != "" {
			v.State, v.Reason = "failed", why
		}
	}
	if sb.inst.ip.IsValid() {
		v.IP = sb.inst.ip.String()
	}
	if l := sb.rec.Lease; l != nil {
		v.ID, v.Env, v.Labels, v.LeasedAt, v.EgressPolicy = l.ID, l.Env, l.Labels, l.LeasedAt, l.EgressPolicy
		v.RestoredFrom, v.ForkedFrom = l.RestoredFrom, l.ForkedFrom
	}
	if p != nil {
		v.Image, v.Workdir = p.t.Image, p.t.Workdir
		v.Limits, v.Isolation = p.t.limits().Over(m.opts.Defaults), isolationOf(&p.t, sb.inst)
		v.Labels = mergeLabels(p.t.Labels, v.Labels)
		if v.EgressPolicy == "" {
			v.EgressPolicy = p.t.EgressPolicy
		}
	}
	return v
}

func mergeLabels(base, over map[string]string) map[string]string {
	if len(base) == 0 {
		return over
	}
	out := maps.Clone(base)
	maps.Copy(out, over)
	return out
}

// ReplaceTask kills a leased sandbox's task and starts a new one with restore (an in-place
// CRIU restore); the sandbox keeps its ID, container, files and network.
func (m *Manager) ReplaceTask(ctx context.Context, id string, restore RestoreFunc) (Sandbox, error) {
	m.mu.Lock()
	sb, ok := m.leased[id]
	m.mu.Unlock()
	if !ok {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	old := sb.inst.ref.Load()
	if err := old.usable(); err != nil {
		return Sandbox{}, fmt.Errorf("replace task of sandbox %q: %w", id, err)
	}
	old.retire() // its exit is expected now
	if err := m.rt.replaceTask(ctx, sb.inst, restore); err != nil {
		old.fail("its task could not be replaced: " + err.Error())
		if ref := sb.inst.ref.Load(); ref != old {
			ref.fail("its task could not be replaced: " + err.Error())
		}
		return Sandbox{}, fmt.Errorf("replace task of sandbox %q: %w", id, err)
	}
	m.watch(sb, sb.inst.ref.Load())
	return m.Get(id)
}

// Template returns a pool's template.
func (m *Manager) Template(name string) (Template, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := m.poolLocked(name)
	if err != nil {
		return Template{}, err
	}
	return p.t, nil
}

// Pause freezes a leased sandbox through containerd (runc pause), so that runtime operations
// that expect a paused task, such as a CRIU dump, see it paused. The checkpoint hot path
// freezes the cgroup directly instead (Freezer), which is faster.
//
// runc gives up on a cgroup v1 freeze that does not settle within its own short bound
// ("unable to freeze", e.g. a process of the sandbox in the middle of a fork on a loaded
// host) and thaws again; such a pause is tried again a few times before it fails.
func (m *Manager) Pause(ctx context.Context, id string) error {
	return m.withTask(ctx, id, func(t containerd.Task) error {
		return retryUnsettledFreeze(ctx, func() error { return t.Pause(ctx) })
	})
}

// retryUnsettledFreeze runs pause until it succeeds, fails otherwise than with runc's
// "unable to freeze", or pauseAttempts tries were made.
func retryUnsettledFreeze(ctx context.Context, pause func() error) error {
	var err error
	for attempt := 0; attempt < pauseAttempts; attempt++ {
		if err = pause(); err == nil || !strings.Contains(err.Error(), "unable to freeze") {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%w (tried %d times)", err, pauseAttempts)
}

// pauseAttempts bounds Pause's tries of a freeze that runc could not settle.
const pauseAttempts = 5

// Resume undoes Pause.
func (m *Manager) Resume(ctx context.Context, id string) error {
	return m.withTask(ctx, id, func(t containerd.Task) error { return t.Resume(ctx) })
}

func (m *Manager) withTask(ctx context.Context, id string, fn func(containerd.Task) error) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	if err := sb.Usable(); err != nil {
		return err
	}
	c, err := m.rt.client.LoadContainer(ctx, sb.Container)
	if err != nil {
		return fmt.Errorf("load container of %q: %w", id, err)
	}
	t, err := c.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("task of %q: %w", id, err)
	}
	return fn(t)
}
