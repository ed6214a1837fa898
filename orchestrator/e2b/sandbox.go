package e2b

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// Metadata keys through which E2B code reaches DeltaBox features at create.
const (
	// MetaEgressPolicy holds the lease's egress policy (YAML, as `deltabox pool lease
	// --egress-policy`), overriding the pool's.
	MetaEgressPolicy = "deltabox.egress_policy"
	// MetaCheckpoint = "per_command" takes an L1 checkpoint before every command started.
	MetaCheckpoint = "deltabox.checkpoint"
)

// denyAllPolicy is the egress policy of a sandbox created with allowInternetAccess: false.
const denyAllPolicy = "version: 1\ndefault: deny\nrules: []\n"

// cleanupTimeout bounds a release or thaw made outside a request.
const cleanupTimeout = 2 * time.Minute

// sandbox is the gateway's record of one sandbox it created.
type sandbox struct {
	g          *Gateway
	id         string
	template   string
	tenant     string
	token      string   // the access token handed out (empty for a sandbox recovered after a restart, until a connect)
	tokenHash  []string // SHA-256 (hex) of the tokens in-sandbox calls may carry
	metadata   map[string]string
	started    time.Time
	autoPause  bool
	perCommand bool
	workdir    string

	mu       sync.Mutex
	end      time.Time
	timer    *time.Timer
	paused   bool
	gone     bool
	procs    map[uint32]*process // by pid (see process.pid)
	seq      uint32              // numbers the gateway's processes (their tags)
	watchers map[string]*watcher
	shell    string // resolved once: /bin/bash or /bin/sh
	// the previous metrics sample (CPU use is reported between samples)
	lastSample time.Time
	lastCPU    uint64
	ctx        context.Context
	cancel     context.CancelFunc
}

// create leases a sandbox from the pool named like the template.
func (g *Gateway) create(ctx context.Context, tenant string, req newSandboxRequest) (*sandbox, error) {
	if req.TemplateID == "" {
		return nil, fmt.Errorf("templateID is required (the name of a DeltaBox pool): %w", errdefs.ErrInvalidArgument)
	}
	timeout, err := g.timeout(req.Timeout)
	if err != nil {
		return nil, err
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return nil, err
	}
	lr := api.LeaseRequest{EgressPolicy: req.Metadata[MetaEgressPolicy], Env: envList(req.EnvVars)}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess && lr.EgressPolicy == "" {
		lr.EgressPolicy = denyAllPolicy
	}
	perCommand := false
	switch v := req.Metadata[MetaCheckpoint]; v {
	case "", "none":
	case "per_command":
		perCommand = true
	default:
		return nil, fmt.Errorf("metadata %s=%q: want per_command or none: %w", MetaCheckpoint, v, errdefs.ErrInvalidArgument)
	}
	if snap := g.snapshotFor(tenant, req.TemplateID); snap != nil {
		return g.createFromSnapshot(ctx, tenant, snap, req, timeout)
	}
	sb := g.newSandbox("", req.TemplateID, tenant, "")
	sb.token = randomToken()
	sb.tokenHash = []string{tokenHash(sb.token)}
	sb.autoPause, sb.perCommand = req.AutoPause != nil && *req.AutoPause, perCommand
	for k, v := range req.Metadata {
		sb.metadata[k] = v
	}
	lr.Labels = sb.leaseLabels()
	l, err := g.b.Lease(ctx, req.TemplateID, lr)
	if err != nil {
		sb.cancel()
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("template %q not found (no DeltaBox pool of that name): %w", req.TemplateID, err)
		}
		return nil, err
	}
	sb.id = l.ID
	if l.Workdir != "" {
		sb.workdir = l.Workdir
	}
	g.mu.Lock()
	closed := g.closed
	if !closed {
		g.sandboxes[sb.id] = sb
	}
	g.mu.Unlock()
	if closed {
		_ = g.b.Release(context.WithoutCancel(ctx), sb.id)
		return nil, fmt.Errorf("the gateway is shutting down: %w", errdefs.ErrUnavailable)
	}
	sb.setTimeout(timeout)
	log.L(ctx).Info("e2b sandbox created", "sandbox", sb.id, "template", sb.template, "tenant", tenant, "timeout", timeout)
	return sb, nil
}

// Bounds of a sandbox's metadata (it is stored with the lease).
const (
	maxMetadataKeys  = 64
	maxMetadataKey   = 256
	maxMetadataValue = 64 << 10
)

func checkMetadata(m map[string]string) error {
	if len(m) > maxMetadataKeys {
		return fmt.Errorf("metadata has %d keys, at most %d: %w", len(m), maxMetadataKeys, errdefs.ErrInvalidArgument)
	}
	for k, v := range m {
		if k == "" || len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return fmt.Errorf("metadata key %.40q: keys are 1-%d bytes, values at most %d: %w", k, maxMetadataKey, maxMetadataValue, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// newSandbox makes the gateway's record of a sandbox (not yet registered).
func (g *Gateway) newSandbox(id, template, tenant, workdir string) *sandbox {
	ctx, cancel := context.WithCancel(context.Background())
	if workdir == "" {
		workdir = "/"
	}
	return &sandbox{g: g, id: id, template: template, tenant: tenant, metadata: map[string]string{},
		started: time.Now(), workdir: workdir, procs: map[uint32]*process{},
		watchers: map[string]*watcher{}, ctx: ctx, cancel: cancel}
}

// timeout turns the seconds of a request into a duration (nil: the default).
func (g *Gateway) timeout(sec *int64) (time.Duration, error) {
	if sec == nil {
		return g.opts.DefaultTimeout, nil
	}
	if *sec < 0 {
		return 0, fmt.Errorf("timeout %d s is negative: %w", *sec, errdefs.ErrInvalidArgument)
	}
	d := time.Duration(*sec) * time.Second
	if d > g.opts.MaxTimeout {
		return 0, fmt.Errorf("timeout %d s is over the maximum %s: %w", *sec, g.opts.MaxTimeout, errdefs.ErrInvalidArgument)
	}
	return d, nil
}

func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// setTimeout (re)arms the sandbox's end: when it passes the sandbox is released, or paused
// when it was created with autoPause.
func (sb *sandbox) setTimeout(d time.Duration) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return
	}
	sb.end = time.Now().Add(d)
	if sb.timer != nil {
		sb.timer.Stop()
	}
	sb.timer = time.AfterFunc(d, sb.expire)
}

func (sb *sandbox) stopTimer() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.timer != nil {
		sb.timer.Stop()
	}
}

// expire acts on a passed timeout.
func (sb *sandbox) expire() {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	ctx = log.WithLogger(ctx, log.L(ctx).With("sandbox", sb.id))
	if sb.isPaused() { // paused meanwhile: a paused sandbox has no timeout running
		return
	}
	if sb.autoPause {
		if err := sb.pause(ctx); err != nil {
			log.L(ctx).Error("e2b timeout: pause failed; releasing", "error", err)
		} else {
			log.L(ctx).Info("e2b timeout passed: sandbox paused")
			return
		}
	}
	if err := sb.kill(ctx); err != nil {
		log.L(ctx).Error("e2b timeout: release failed", "error", err)
		return
	}
	log.L(ctx).Info("e2b timeout passed: sandbox released")
}

// kill releases the sandbox to its pool; its processes and watchers end.
func (sb *sandbox) kill(ctx context.Context) error {
	sb.mu.Lock()
	if sb.gone {
		sb.mu.Unlock()
		return fmt.Errorf("sandbox %q not found: %w", sb.id, errdefs.ErrNotFound)
	}
	sb.gone = true
	if sb.timer != nil {
		sb.timer.Stop()
	}
	paused := sb.paused
	sb.mu.Unlock()
	sb.cancel() // ends every process stream and watcher of the gateway
	if paused {
		if err := sb.g.b.Thaw(ctx, sb.id); err != nil {
			log.L(ctx).Warn("thaw before release", "sandbox", sb.id, "error", err)
		}
	}
	sb.g.mu.Lock()
	delete(sb.g.sandboxes, sb.id)
	sb.g.mu.Unlock()
	return sb.g.b.Release(ctx, sb.id)
}

// pause takes a checkpoint (the sandbox's files at the pause) and freezes its processes; the
// timeout stops until it is resumed. Already paused is a conflict.
func (sb *sandbox) pause(ctx context.Context) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return fmt.Errorf("sandbox %q not found: %w", sb.id, errdefs.ErrNotFound)
	}
	if sb.paused {
		return fmt.Errorf("sandbox %q is already paused: %w", sb.id, errdefs.ErrConflict)
	}
	if _, err := sb.g.b.Checkpoint(ctx, sb.id, api.CheckpointRequest{Message: "e2b pause"}); err != nil {
		return fmt.Errorf("checkpoint before pause: %w", err)
	}
	if err := sb.g.b.Freeze(ctx, sb.id); err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	sb.paused = true
	if sb.timer != nil {
		sb.timer.Stop()
	}
	return nil
}

// resume thaws a paused sandbox and rearms its timeout; it reports whether it was paused. A
// sandbox recovered after a restart gets a new access token (the old one keeps working).
func (sb *sandbox) resume(ctx context.Context, timeout time.Duration) (bool, error) {
	sb.mu.Lock()
	if sb.token == "" {
		sb.token = randomToken()
		sb.tokenHash = append(sb.tokenHash, tokenHash(sb.token))
	}
	was := sb.paused
	if sb.gone {
		sb.mu.Unlock()
		return false, fmt.Errorf("sandbox %q not found: %w", sb.id, errdefs.ErrNotFound)
	}
	if was {
		if err := sb.g.b.Thaw(ctx, sb.id); err != nil {
			sb.mu.Unlock()
			return false, fmt.Errorf("thaw: %w", err)
		}
		sb.paused = false
	}
	sb.mu.Unlock()
	sb.setTimeout(timeout)
	return was, nil
}

func (sb *sandbox) isPaused() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.paused
}

func (sb *sandbox) state() string {
	if sb.isPaused() {
		return "paused"
	}
	return "running"
}

// listed describes the sandbox for list and info.
func (sb *sandbox) listed(withToken bool) sandboxListed {
	sb.mu.Lock()
	end := sb.end
	sb.mu.Unlock()
	out := sandboxListed{TemplateID: sb.template, SandboxID: sb.id, ClientID: "deltabox",
		StartedAt: sb.started.UTC().Format(time.RFC3339Nano), EndAt: end.UTC().Format(time.RFC3339Nano),
		Metadata: sb.metadata, State: sb.state(), EnvdVersion: EnvdVersion, VolumeMounts: []struct{}{}}
	if info, err := sb.g.b.Sandbox(sb.id); err == nil {
		out.CPUCount = int(info.Limits.CPUs + 0.999)
		out.MemoryMB = info.Limits.MemoryBytes >> 20
		out.DiskSizeMB = info.Limits.DiskBytes >> 20
	}
	if withToken {
		sb.mu.Lock()
		out.EnvdAccessToken = sb.token
		sb.mu.Unlock()
	}
	return out
}

// matches reports whether the sandbox passes a list's filters.
func (sb *sandbox) matches(states []string, meta map[string]string) bool {
	if len(states) > 0 {
		ok := false
		for _, s := range states {
			ok = ok || strings.TrimSpace(s) == sb.state()
		}
		if !ok {
			return false
		}
	}
	for k, v := range meta {
		if sb.metadata[k] != v {
			return false
		}
	}
	return true
}
