// Package orchestrator is DeltaBox's node agent core: it owns sandbox lifecycle and the
// checkpoint protocol and wires pool, overlay, criu, proxy and objectstore together. It is the
// only package allowed to import all the others. It serves the HTTP/JSON API of
// orchestrator/api; it never parses CLI flags or TOML (the daemon wiring in cmd/deltabox turns
// configuration into Options).
package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/criu/proctpl"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/snapsign"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/network"
	"github.com/deltabox/deltabox/proxy"
)

// Options configure an Orchestrator.
type Options struct {
	Root              string        // state root, e.g. /var/lib/deltabox
	ContainerdAddress string        // containerd socket
	Namespace         string        // containerd namespace
	ConnectTimeout    time.Duration // how long to wait for containerd at start
	CRIUPath          string        // criu binary
	ObjectStoreURI    string        // where L3 snapshots go; empty: file://<root>/objects
	InitBinary        string        // static deltabox-init to mount into sandboxes
	Metrics           *prometheus.Registry
	Retain            int // checkpoints kept per sandbox, whole tree (default 64)
	RetainBranch      int // checkpoints kept on a path from the first one to a branch tip (default Retain)
	// TemplateMemory and TemplateMemorySandbox bound the memory process templates hold
	// alone on the node and per sandbox (0: unbounded; processes.go).
	TemplateMemory, TemplateMemorySandbox int64
	// TemplateCheckpoints bounds how many checkpoints of a sandbox keep process templates
	// (0: unbounded; tplbounds.go).
	TemplateCheckpoints int
	// HugePagesBudget bounds the time a checkpoint with processes spends, before its
	// freeze, collapsing the memory of processes about to get their first template into
	// huge pages (hugepages.go; 0: never).
	HugePagesBudget time.Duration
	StepMax         int              // exec records kept per sandbox (default 2000; -1: none recorded)
	StepOutputBytes int              // first and last bytes of each output stream kept per exec record (default 2048)
	L2Every         int              // after this many L1 checkpoints in a row the next is L2 (0: never)
	WalkUpperDirs   bool             // captures walk the upper dir instead of using the change tracker
	Network         *network.Options // sandbox networking; nil: loopback only
	Egress          EgressOptions    // the egress proxy (with Network only)
	Effects         Effects          // the egress proxy's hooks (default: none held)
	// API request limits (0: the defaults, DefaultRequestsPerSandbox and
	// DefaultRequestBodyBudget): requests in flight per sandbox, and bytes of request bodies
	// held in memory at once by the whole daemon.
	RequestsPerSandbox int
	RequestBodyBudget  int64
	Snapshots          SnapshotOptions // signing and trust of L3 snapshots
	SandboxDefaults    pool.Limits     // limits of sandboxes whose pool sets none (zero: unlimited)

	// ForkLayerMemory bounds the tmpfs of the shared fork layers (pool.Options.ForkLowerMemory:
	// 0 default, negative none).
	ForkLayerMemory int64
}

// SnapshotOptions configure how L3 snapshots are signed and which are trusted.
type SnapshotOptions struct {
	// SigningKey is the node's Ed25519 private key (PEM, PKCS#8), created on first start;
	// default <root>/keys/snapshot.key. Its public key is written beside it (.pub).
	SigningKey string
	// TrustedKeys are further public keys whose snapshots this node restores: inline
	// ("ed25519:BASE64") or files of PEM PUBLIC KEY blocks / inline keys. The node's own key
	// is always trusted.
	TrustedKeys []string
	// RestoreTimeout bounds one CRIU restore (default 2 minutes).
	RestoreTimeout time.Duration
	// DumpTimeout bounds one CRIU dump (default criu.DefaultDumpTimeout).
	DumpTimeout time.Duration
	// LazyRestore restores processes' memory lazily where the kernel allows it
	// (criu.WithLazyPages).
	LazyRestore bool
	// RestoreMemory bounds the tmpfs restores stage the snapshots they download on
	// (restore_area.go; 0: DefaultRestoreMemory, negative: on disk only; with LazyRestore
	// restores stage on disk).
	RestoreMemory int64
}

// DefaultRestoreMemory bounds the tmpfs of restore staging by default.
const DefaultRestoreMemory = 1 << 30

func (o *Options) setDefaults() {
	if o.Root == "" {
		o.Root = "/var/lib/deltabox"
	}
	if o.Namespace == "" {
		o.Namespace = "deltabox"
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 4 * time.Second
	}
	if o.CRIUPath == "" {
		o.CRIUPath = "criu"
	}
	if o.Retain == 0 {
		o.Retain = 64
	}
	if o.StepMax == 0 {
		o.StepMax = 2000
	}
	if o.StepOutputBytes <= 0 {
		o.StepOutputBytes = 2048
	}
	if o.RetainBranch == 0 || o.RetainBranch > o.Retain {
		o.RetainBranch = o.Retain
	}
	if o.Effects == nil {
		o.Effects = noEffects{}
	}
	if o.ObjectStoreURI == "" {
		o.ObjectStoreURI = "file://" + filepath.Join(o.Root, "objects")
	}
	if o.Snapshots.SigningKey == "" {
		o.Snapshots.SigningKey = filepath.Join(o.Root, "keys", "snapshot.key")
	}
	if o.Snapshots.RestoreTimeout == 0 {
		o.Snapshots.RestoreTimeout = 2 * time.Minute
	}
	if o.Snapshots.DumpTimeout == 0 {
		o.Snapshots.DumpTimeout = criu.DefaultDumpTimeout
	}
}

// Orchestrator is the running node agent.
type Orchestrator struct {
	closed atomic.Bool // Close began (see closing)
	opts   Options
	client *containerd.Client
	criu   criu.Status
	node   string
	// sdkDir holds the SDKs every sandbox mounts read-only at /.deltabox/sdk.
	sdkDir string
	// remoteAPI is the TCP listener of the host API, for Info (nil: none).
	remoteAPI atomic.Pointer[api.RemoteAPI]
	pools     *pool.Manager
	net       *network.Manager
	proxy     *proxy.Proxy
	l3        *criu.Checkpointer
	// cgroupYard is the CRIU cgroup yard every sandbox's CRIU configuration names
	// (criu.PrepareCgroupYard; "" when it could not be made).
	cgroupYard string
	closers    []func() error
	restores   restoreArea // where restores stage what they download
	effects    Effects
	signer     *snapsign.Signer   // signs the manifests this node pushes
	trust      *snapsign.Verifier // keys whose snapshots this node restores

	limiterOnce sync.Once
	limits      *requestLimiter // API request limits (see reqlimit.go)

	mu       sync.Mutex
	sessions map[string]*session // by sandbox (lease) ID

	procs procTable // detached execs (procs.go)

	tracerOnce sync.Once
	ptrace     []*proctpl.Tracer // the ptrace threads of the process templates (processes.go)

	hugeOnce     sync.Once
	hugeUnusable bool // transparent huge pages are off on the node (hugepages.go)
}

// New connects to containerd (failing within ConnectTimeout, naming the address), prepares
// the state root and probes CRIU. A CRIU that is missing or unusable disables L3 only.
func New(ctx context.Context, opts Options) (*Orchestrator, error) {
	opts.setDefaults()
	if err := os.MkdirAll(opts.Root, 0o700); err != nil {
		return nil, fmt.Errorf("create state root %s: %w", opts.Root, err)
	}
	// Others may traverse the state root, not list it: the restore of a user-namespaced
	// sandbox opens its bind-mount sources (the init binary, its run directory) as the
	// sandbox's root (pool/userns.go). Every directory below keeps its own mode (0700 but
	// for bin/ and the pool's containers/).
	if err := os.Chmod(opts.Root, 0o711); err != nil {
		return nil, fmt.Errorf("state root %s: %w", opts.Root, err)
	}
	if dir := closedAncestor(opts.Root); dir != "" {
		log.L(ctx).Warn("a directory above the state root is not searchable by others: CRIU restores (L3 rollback, snapshot restore, fork with processes) in user-namespaced pools will fail; chmod o+x it or move the state root",
			"dir", dir, "root", opts.Root)
	}
	client, err := connect(ctx, opts)
	if err != nil {
		return nil, err
	}
	o := &Orchestrator{opts: opts, client: client, effects: opts.Effects, sessions: map[string]*session{}}
	if err := o.start(ctx); err != nil {
		client.Close()
		return nil, err
	}
	return o, nil
}

// prepareCRIU primes CRIU's kernel-features cache and makes its cgroup yard (see
// criu.PrimeKdatCache and criu.PrepareCgroupYard). Neither is needed for CRIU to work: a
// failure is logged and CRIU runs as it would without.
func (o *Orchestrator) prepareCRIU(ctx context.Context) {
	if primed, err := criu.PrimeKdatCache(ctx, o.opts.CRIUPath); err != nil {
		log.L(ctx).Warn("CRIU probes the kernel at every dump and restore (~30 ms each)", "error", err)
	} else if primed {
		log.L(ctx).Debug("CRIU kernel-features cache primed", "path", criu.KdatCache)
	}
	yard := criu.DefaultCgroupYard
	bound, err := criu.PrepareCgroupYard(yard)
	if err == nil {
		err = criu.Options{CgroupYard: yard}.Validate()
	}
	if err != nil {
		log.L(ctx).Warn("no CRIU cgroup yard: every CRIU run mounts the cgroup hierarchies, which resets the node's cgroup2 flags (favordynmods, nsdelegate)", "error", err)
		return
	}
	o.cgroupYard = yard
	log.L(ctx).Debug("CRIU cgroup yard", "dir", yard, "hierarchies", bound)
}

func (o *Orchestrator) start(ctx context.Context) (err error) {
	o.criu = criu.NewChecker(o.opts.CRIUPath).Check(ctx)
	if o.criu, err = criu.CheckBreakpoints(o.criu, o.opts.ContainerdAddress); err != nil {
		log.L(ctx).Warn("cannot tell whether CRIU can dump on this host", "error", err)
		err = nil
	}
	if !o.criu.Available {
		log.L(ctx).Warn("L3 checkpoints disabled", "reason", o.criu.Reason)
	}
	if o.node, err = nodeID(o.opts.Root); err != nil {
		return err
	}
	if err := o.loadSnapshotKeys(ctx); err != nil {
		return err
	}
	initBin, err := installInit(o.opts.InitBinary, filepath.Join(o.opts.Root, "bin"))
	if err != nil {
		return err
	}
	if o.sdkDir, err = installSDK(o.opts.Root); err != nil {
		return err
	}
	o.restores = restoreArea{root: o.opts.Root, limit: o.opts.Snapshots.RestoreMemory}
	switch {
	case o.opts.Snapshots.LazyRestore:
		// A lazy restore's page server hard-links the images into the CRIU work dir
		// (criu.WithLazyPages), on the state root's file system: they stage there too.
		o.restores.limit = -1
	case o.restores.limit == 0:
		o.restores.limit = DefaultRestoreMemory
	}
	work := filepath.Join(o.opts.Root, "criu-work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	if o.criu.Available {
		o.prepareCRIU(ctx)
	}
	o.l3 = criu.New(o.client, criu.WithStatus(o.criu), criu.WithCRIUPath(o.opts.CRIUPath), criu.WithWorkRoot(work), criu.WithDumpTimeout(o.opts.Snapshots.DumpTimeout), criu.WithLazyPages(o.opts.Snapshots.LazyRestore))
	if o.opts.Metrics != nil {
		o.registerTemplateMetrics(o.opts.Metrics)
	}
	popts := pool.Options{
		Root: filepath.Join(o.opts.Root, "pool"), InitBinary: initBin, Node: o.node, Metrics: o.opts.Metrics,
		Reset: o.resetFiles, SpecOpts: o.sandboxSpec, Claims: o.readClaims,
		Defaults: o.opts.SandboxDefaults, ForkLowerMemory: o.opts.ForkLayerMemory,
	}
	if o.opts.Network != nil {
		nopts := *o.opts.Network
		nopts.StateDir = filepath.Join(o.opts.Root, "network")
		if o.net, err = network.New(ctx, nopts); err != nil {
			return fmt.Errorf("sandbox network: %w", err)
		}
		popts.Network = o.net
		if err := o.startEgress(ctx, nopts); err != nil {
			return err
		}
		o.keepFirewall(ctx)
	}
	o.pools, err = pool.NewManager(ctx, o.client, popts)
	if err != nil {
		return err
	}
	return o.resumeSessions(ctx)
}

// resumeSessions reopens the sessions of sandboxes that stayed leased across a restart and
// sweeps what interrupted operations left behind. A quarantined sandbox's session and journal
// are kept, unopened, for the operator to adopt or destroy.
func (o *Orchestrator) resumeSessions(ctx context.Context) error {
	leased := map[string]bool{}
	for _, sb := range o.pools.List() {
		leased[sb.ID] = true
	}
	for _, q := range o.pools.Quarantined() {
		leased[q.ID] = true // kept: not leased, but not gone either
	}
	o.sweep(ctx, leased)
	for _, sb := range o.pools.List() {
		o.startSession(ctx, sb)
	}
	return nil
}

func connect(ctx context.Context, opts Options) (*containerd.Client, error) {
	if addr := strings.TrimPrefix(opts.ContainerdAddress, "unix://"); filepath.IsAbs(addr) {
		if _, err := os.Stat(addr); err != nil {
			return nil, fmt.Errorf("containerd at %q is unreachable: %v: %w", opts.ContainerdAddress, err, errdefs.ErrUnavailable)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancel()
	client, err := containerd.New(opts.ContainerdAddress,
		containerd.WithDefaultNamespace(opts.Namespace),
		containerd.WithTimeout(opts.ConnectTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %q: %v: %w", opts.ContainerdAddress, err, errdefs.ErrUnavailable)
	}
	if _, err := client.Version(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd at %q is unreachable (waited %s): %v: %w",
			opts.ContainerdAddress, opts.ConnectTimeout, err, errdefs.ErrUnavailable)
	}
	return client, nil
}

// Close releases the containerd connection. Sandboxes keep running.
func (o *Orchestrator) Close(ctx context.Context) error {
	o.closed.Store(true)
	var errs []error
	if o.pools != nil {
		errs = append(errs, o.pools.Close())
	}
	for _, c := range o.closers {
		errs = append(errs, c())
	}
	if o.proxy != nil {
		errs = append(errs, o.proxy.Close())
	}
	o.mu.Lock()
	sessions := o.sessions
	o.sessions = map[string]*session{}
	o.mu.Unlock()
	for _, s := range sessions {
		<-s.ready
		errs = append(errs, s.frz.Thaw(), s.close())
	}
	errs = append(errs, o.restores.close(), o.client.Close())
	return errors.Join(errs...)
}

// keepFirewall re-applies the sandbox firewall every minute, so that a host firewall reload
// (or a rule inserted above DeltaBox's jumps) cannot leave sandboxes unfiltered for long.
func (o *Orchestrator) keepFirewall(ctx context.Context) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	o.closers = append(o.closers, func() error { cancel(); return nil })
	go func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := o.net.Ensure(ctx); err != nil {
					log.L(ctx).Error("re-apply sandbox firewall", "error", err)
				}
			}
		}
	}()
}

// closedAncestor returns the first directory above root that others may not search ("" for
// none): a CRIU restore opens the sandbox's bind-mount sources below root as the sandbox's
// root, an unprivileged host id.
func closedAncestor(root string) string {
	abs, err := filepath.Abs(root)
	if err != nil {
		return ""
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if info, err := os.Stat(dir); err == nil && info.Mode().Perm()&0o001 == 0 {
			return dir
		}
		if dir == "/" || dir == "." {
			return ""
		}
	}
}
