package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deltabox/deltabox/internal/log"
)

// Options configure a Manager.
type Options struct {
	Root              string // pool state: database and per-container directories
	InitBinary        string // host path of the static deltabox-init
	Node              string // this node's ID; containers are labelled with it
	Snapshotter       string // containerd snapshotter (default overlayfs)
	Runtime           string // containerd runtime (default io.containerd.runc.v2)
	CreateConcurrency int    // sandboxes created at once by the fillers (default 4)
	Metrics           prometheus.Registerer
	// Network, when set, gives every sandbox its own network namespace that can reach only
	// the egress proxy (pool/network). Without it a sandbox has a private loopback only.
	Network Network
	// SpecOpts adds runtime-spec options for a new container (dir is its host directory).
	SpecOpts func(cid, dir string) ([]oci.SpecOpts, error)
	// Reset, when set, returns a released sandbox's filesystem to the image's state with
	// only init running; the sandbox is then reused. Without it, or when it fails, a released
	// sandbox is destroyed and the filler creates a fresh one.
	Reset func(ctx context.Context, sb Sandbox) error
	// Claims, when set, returns what outside the pool database says about this node's
	// containers, by container ID (the orchestrator: which lease's session names it). At
	// start a claimed container is never destroyed for want of a trusted record: it is
	// quarantined.
	Claims func(ctx context.Context) map[string]Claim
	// Defaults are the limits of sandboxes whose template leaves one unset (zero: unlimited).
	Defaults Limits
	// IDRegistry is the host-wide directory where every daemon of the host records the user
	// namespace id ranges it hands out (default DefaultIDRegistry): daemons with different
	// state roots on one host then never hand out the same range.
	IDRegistry string
	// ForkLowerMemory bounds the tmpfs that holds shared fork layers in memory
	// (forklower.go; default DefaultForkLowerMemory; negative: fork layers on disk only).
	ForkLowerMemory int64
}

func (o *Options) setDefaults() {
	if o.Snapshotter == "" {
		o.Snapshotter = "overlayfs"
	}
	if o.Runtime == "" {
		o.Runtime = "io.containerd.runc.v2"
	}
	if o.CreateConcurrency <= 0 {
		o.CreateConcurrency = 4
	}
	if o.IDRegistry == "" {
		o.IDRegistry = DefaultIDRegistry
	}
	if o.ForkLowerMemory == 0 {
		o.ForkLowerMemory = DefaultForkLowerMemory
	}
}

// Manager owns the pools and sandboxes of one node.
type Manager struct {
	opts    Options
	rt      *runtime
	st      *store
	metrics *metrics
	sem     chan struct{} // bounds concurrent creates

	mu     sync.Mutex
	pools  map[string]*pool
	leased map[string]*sandbox // by lease ID
	// quarantine holds the sandboxes whose record could not be trusted at start, by ID.
	quarantine map[string]*Quarantined
	closing    bool
	// flMu guards the fork layers' list and holds (forklower.go).
	flMu   sync.Mutex
	flPins map[string]int

	ctx    context.Context // cancelled by Close; parent of the fillers
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// pool is one template and its sandboxes; guarded by Manager.mu.
type pool struct {
	t        Template
	ready    []*sandbox // FIFO
	creating int
	leased   int
	kick     chan struct{}
	stop     chan struct{}
	failures int // consecutive create failures, for backoff
	// lastLease is when a ready sandbox was last taken, for the filler's quiet period.
	lastLease time.Time
}

func (p *pool) total() int { return len(p.ready) + p.creating + p.leased }

// sandbox is one container of a pool.
type sandbox struct {
	rec  record
	inst *instance
	// noReroot marks a ready sandbox found unfit to be moved onto a fork layer
	// (rerootable); it is never tried again.
	noReroot bool
}

// NewManager opens the pool database, reconciles it with containerd's containers and starts
// the fillers.
func NewManager(ctx context.Context, client *containerd.Client, opts Options) (*Manager, error) {
	opts.setDefaults()
	if opts.Node == "" {
		return nil, fmt.Errorf("pool manager needs a node ID: %w", errdefs.ErrInvalidArgument)
	}
	if err := opts.Defaults.Validate("sandbox defaults"); err != nil {
		return nil, err
	}
	if _, err := os.Stat(opts.InitBinary); err != nil {
		return nil, fmt.Errorf("sandbox init binary: %w", err)
	}
	// Traversable, not listable: each sandbox's directory below is open to its own root only
	// (allocateIDs).
	for _, dir := range []string{opts.Root, filepath.Join(opts.Root, "containers")} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("create pool root: %w", err)
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, fmt.Errorf("pool root: %w", err)
		}
	}
	st, err := openStore(filepath.Join(opts.Root, "pool.db"))
	if err != nil {
		return nil, err
	}
	m := &Manager{
		opts: opts, st: st, sem: make(chan struct{}, opts.CreateConcurrency),
		pools: map[string]*pool{}, leased: map[string]*sandbox{}, quarantine: map[string]*Quarantined{},
		flPins: map[string]int{},
		rt: &runtime{client: client, snapshotter: opts.Snapshotter, runtimeName: opts.Runtime,
			initBin: opts.InitBinary, dir: filepath.Join(opts.Root, "containers"), node: opts.Node,
			net: opts.Network, specOpts: opts.SpecOpts, defaults: opts.Defaults, ids: newIDRanges(opts.IDRegistry)},
	}
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if m.metrics, err = newMetrics(m, opts.Metrics); err != nil {
		st.close()
		return nil, err
	}
	if err := m.reconcile(ctx); err != nil {
		st.close()
		return nil, fmt.Errorf("reconcile sandboxes: %w", err)
	}
	for _, p := range m.pools {
		m.startFiller(p)
	}
	return m, nil
}

// Close stops the fillers. Sandboxes keep running; a restarted manager finds them again.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	return m.st.close()
}

func newID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// CreatePool registers a template and starts filling its pool. The image must exist.
func (m *Manager) CreatePool(ctx context.Context, t Template) (PoolInfo, error) {
	if err := t.Validate(); err != nil {
		return PoolInfo{}, err
	}
	if _, err := m.rt.image(ctx, t.Image); err != nil {
		return PoolInfo{}, fmt.Errorf("pool %q: %w", t.Name, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.pools[t.Name]; ok {
		return PoolInfo{}, fmt.Errorf("pool %q already exists: %w", t.Name, errdefs.ErrAlreadyExists)
	}
	if err := m.st.put(bucketPools, t.Name, t); err != nil {
		return PoolInfo{}, fmt.Errorf("record pool %q: %w", t.Name, err)
	}
	p := m.addPool(t)
	m.startFiller(p)
	log.L(ctx).Info("pool created", "pool", t.Name, "image", t.Image, "min_ready", t.MinReady, "max", t.Max)
	return m.info(p), nil
}

func (m *Manager) addPool(t Template) *pool {
	p := &pool{t: t, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	m.pools[t.Name] = p
	return p
}

// ScalePool changes a pool's min_ready (and raises max if needed).
func (m *Manager) ScalePool(ctx context.Context, name string, minReady int) (PoolInfo, error) {
	if minReady < 0 {
		return PoolInfo{}, fmt.Errorf("min_ready %d must not be negative: %w", minReady, errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	p, err := m.poolLocked(name)
	if err != nil {
		m.mu.Unlock()
		return PoolInfo{}, err
	}
	t := p.t
	t.MinReady, t.Max = minReady, max(t.Max, minReady)
	if err := m.st.put(bucketPools, name, t); err != nil {
		m.mu.Unlock()
		return PoolInfo{}, fmt.Errorf("record pool %q: %w", name, err)
	}
	p.t = t
	excess := m.trimLocked(p)
	info := m.info(p)
	m.mu.Unlock()
	m.destroyAll(ctx, excess)
	p.poke()
	log.L(ctx).Info("pool scaled", "pool", name, "min_ready", minReady)
	return info, nil
}

// trimLocked takes ready sandboxes beyond min_ready out of p and returns them.
func (m *Manager) trimLocked(p *pool) []*sandbox {
	n := len(p.ready) - p.t.MinReady
	if n <= 0 {
		return nil
	}
	excess := append([]*sandbox(nil), p.ready[len(p.ready)-n:]...)
	p.ready = p.ready[:len(p.ready)-n]
	return excess
}

// RemovePool destroys a pool's ready sandboxes and forgets it. Leased sandboxes make it
// fail unless force is set, in which case they are destroyed too.
func (m *Manager) RemovePool(ctx context.Context, name string, force bool) error {
	m.mu.Lock()
	p, err := m.poolLocked(name)
	if err == nil && p.leased > 0 && !force {
		err = fmt.Errorf("pool %q has %d leased sandboxes (release them or use --force): %w", name, p.leased, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		m.mu.Unlock()
		return err
	}
	victims := p.ready
	p.ready = nil
	for id, sb := range m.leased {
		if sb.rec.Pool == name {
			victims = append(victims, sb)
			delete(m.leased, id)
		}
	}
	delete(m.pools, name)
	close(p.stop)
	m.mu.Unlock()
	m.destroyAll(ctx, victims)
	if err := m.st.delete(bucketPools, name); err != nil {
		return fmt.Errorf("forget pool %q: %w", name, err)
	}
	log.L(ctx).Info("pool removed", "pool", name, "destroyed", len(victims))
	return nil
}

func (m *Manager) poolLocked(name string) (*pool, error) {
	p, ok := m.pools[name]
	if !ok {
		return nil, fmt.Errorf("pool %q: %w", name, errdefs.ErrNotFound)
	}
	return p, nil
}

// Pools lists the pools, sorted by name.
func (m *Manager) Pools() []PoolInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PoolInfo, 0, len(m.pools))
	for _, p := range m.pools {
		out = append(out, m.info(p))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Pool returns one pool.
func (m *Manager) Pool(name string) (PoolInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := m.poolLocked(name)
	if err != nil {
		return PoolInfo{}, err
	}
	return m.info(p), nil
}

// PoolInfo is a pool's template and counts, with the limits and isolation its sandboxes get
// (the template's limits over the node defaults).
type PoolInfo struct {
	Template
	Ready     int       `json:"ready"`
	Creating  int       `json:"creating"`
	Leased    int       `json:"leased"`
	Limits    Limits    `json:"limits"`
	Isolation Isolation `json:"isolation"`
}

func (m *Manager) info(p *pool) PoolInfo {
	return PoolInfo{Template: p.t, Ready: len(p.ready), Creating: p.creating, Leased: p.leased,
		Limits: p.t.limits().Over(m.opts.Defaults), Isolation: PoolIsolation(&p.t)}
}

// Defaults returns the limits of sandboxes whose template sets none.
func (m *Manager) Defaults() Limits { return m.opts.Defaults }

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (m *Manager) destroyAll(ctx context.Context, sbs []*sandbox) {
	var wg sync.WaitGroup
	for _, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.destroy(ctx, sb)
		}()
	}
	wg.Wait()
}

// destroy removes a sandbox's container and record. A failed destroy leaves a tombstone in
// the record and is retried in the background (and by reconcile at the next start).
func (m *Manager) destroy(ctx context.Context, sb *sandbox) {
	sb.inst.ref.Load().retire()
	rec := sb.rec
	if err := m.rt.destroy(ctx, rec.CID); err != nil {
		log.L(ctx).Error("destroy sandbox (retried)", "container", rec.CID, "error", err)
		rec.Destroying = true
		if err := m.st.put(bucketContainers, rec.CID, rec); err != nil {
			log.L(ctx).Error("record destroy tombstone", "container", rec.CID, "error", err)
		}
		go m.retryDestroy(context.WithoutCancel(ctx), rec.CID)
		return
	}
	if err := m.st.delete(bucketContainers, rec.CID); err != nil {
		log.L(ctx).Error("forget sandbox", "container", rec.CID, "error", err)
	}
	m.dropForkLower(ctx, sb.inst.layout.Folded) // its shared layer, if it was the last user
}

// retryDestroy retries a failed destroy with backoff until it succeeds or the manager closes.
func (m *Manager) retryDestroy(ctx context.Context, cid string) {
	for delay := time.Second; ; delay = min(2*delay, time.Minute) {
		select {
		case <-m.ctx.Done():
			return
		case <-time.After(delay):
		}
		if err := m.rt.destroy(ctx, cid); err != nil {
			log.L(ctx).Warn("destroy sandbox", "container", cid, "error", err, "retry_in", 2*delay)
			continue
		}
		if err := m.st.delete(bucketContainers, cid); err != nil {
			log.L(ctx).Error("forget sandbox", "container", cid, "error", err)
		}
		log.L(ctx).Info("sandbox destroyed on retry", "container", cid)
		return
	}
}

// waitBackoff sleeps after create failures, at most 5 s, or until the pool stops.
func waitBackoff(ctx context.Context, p *pool, failures int) bool {
	if failures == 0 {
		return true
	}
	d := min(time.Duration(failures)*200*time.Millisecond, 5*time.Second)
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
	case <-p.stop:
	}
	return false
}
