// Package e2b serves an E2B-compatible API on top of the orchestrator, so that code written
// for the e2b SDKs runs on DeltaBox unchanged: the control plane (create, list, connect,
// kill, timeout, pause/resume, metrics) and the in-sandbox services the SDK reaches through
// E2B_SANDBOX_URL (the Connect process and filesystem services, envd's /files and /health).
// A sandbox is a DeltaBox lease from the pool named like the E2B template; every API key is a
// tenant that sees only the sandboxes it created. It owns no sandbox state of its own beyond
// that bookkeeping and drives sandboxes only through Backend; it must not import pool or
// containerd packages.
package e2b

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// EnvdVersion is the envd version the gateway reports; the SDK picks protocol features by it
// (0.5.7: octet-stream uploads and CloseStdin).
const EnvdVersion = "0.5.7"

// EnvdPort is the only in-sandbox port the gateway serves (envd's).
const EnvdPort = "49983"

// Backend is what the gateway needs of the orchestrator.
type Backend interface {
	Lease(ctx context.Context, pool string, req api.LeaseRequest) (api.Lease, error)
	Release(ctx context.Context, id string) error
	Sandbox(id string) (api.Sandbox, error)
	// ExecNotify runs a command on pipes; ExecTTY on a terminal (req.TTY set), its input from
	// input until closed or an EOF. started gets the command's pid in the sandbox once it runs
	// (not at all when it could not be started, or the sandbox's init predates start reports).
	ExecNotify(ctx context.Context, id string, req api.ExecRequest, started func(pid int), stdin io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error)
	ExecTTY(ctx context.Context, id string, req api.ExecRequest, started func(pid int), input <-chan api.TTYInput, out io.Writer) (api.ExitStatus, error)
	KillTag(ctx context.Context, id, tag string) (int, error)
	// SignalTag sends sig ("SIGTERM") once to the processes of the execs tagged tag.
	SignalTag(ctx context.Context, id, tag, sig string) (int, error)
	SandboxRoot(ctx context.Context, id string) (*rootfs.Root, error)
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
	Checkpoint(ctx context.Context, id string, req api.CheckpointRequest) (api.Checkpoint, error)
	Checkpoints(ctx context.Context, id string) ([]api.Checkpoint, error)
	Rollback(ctx context.Context, id string, req api.RollbackRequest) (api.RollbackResult, error)
	Commit(ctx context.Context, id string) (api.CommitResult, error)
	Sandboxes() []api.Sandbox
	ForkSandbox(ctx context.Context, id string, count int) ([]api.Lease, error)
	PushSnapshot(ctx context.Context, id string) (api.Snapshot, error)
	RestoreSnapshot(ctx context.Context, uri, pool string) (api.Lease, error)
	SnapshotRemove(ctx context.Context, uri string) error
	SandboxUsage(id string) (cpuNanos, memoryBytes uint64, err error)
}

// Options configure a Gateway.
type Options struct {
	// Keys are the accepted API keys (each one a tenant).
	Keys []string
	// DefaultTimeout is a sandbox's lifetime when create names none (default 5 minutes).
	DefaultTimeout time.Duration
	// MaxTimeout bounds any timeout asked for (default 24 hours).
	MaxTimeout time.Duration
}

// Gateway is the E2B-compatible API.
type Gateway struct {
	b    Backend
	opts Options
	keys map[[32]byte]string // sha256(key) -> tenant

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	snapshots map[string]*snapshot // by ID
	closed    bool
}

// New returns a gateway over b. It needs at least one key.
func New(b Backend, opts Options) (*Gateway, error) {
	if len(opts.Keys) == 0 {
		return nil, fmt.Errorf("e2b gateway: no API keys: %w", errdefs.ErrInvalidArgument)
	}
	if opts.DefaultTimeout <= 0 {
		opts.DefaultTimeout = 5 * time.Minute
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = 24 * time.Hour
	}
	g := &Gateway{b: b, opts: opts, keys: map[[32]byte]string{}, sandboxes: map[string]*sandbox{}, snapshots: map[string]*snapshot{}}
	for _, k := range opts.Keys {
		sum := sha256.Sum256([]byte(k))
		g.keys[sum] = hex.EncodeToString(sum[:6])
	}
	g.recover(context.Background())
	return g, nil
}

// ReadKeys reads an API keys file: one key a line; blank lines and lines starting with '#'
// are skipped. A key shorter than 16 characters is refused.
func ReadKeys(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("e2b api keys: %w", err)
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < 16 {
			return nil, fmt.Errorf("e2b api keys %s line %d: a key needs at least 16 characters: %w", path, n, errdefs.ErrInvalidArgument)
		}
		keys = append(keys, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("e2b api keys %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("e2b api keys %s holds no key: %w", path, errdefs.ErrInvalidArgument)
	}
	return keys, nil
}

// Handler returns the gateway's HTTP handler (control plane and in-sandbox services).
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	g.controlRoutes(mux)
	g.envdRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, fmt.Errorf("no route %s %s in DeltaBox's E2B gateway: %w", r.Method, r.URL.Path, errUnimplemented))
	})
	return g.ports(mux)
}

// ports sends requests for a sandbox port other than envd's to that port of the sandbox
// (proxyPort), after the same token check as the sandbox API; the rest goes to next.
func (g *Gateway) ports(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
		if id == "" {
			id, port = sandboxFromHost(r.Host)
		}
		if id == "" || port == "" || port == EnvdPort {
			next.ServeHTTP(w, r)
			return
		}
		sb, err := g.envdSandbox(r)
		if err != nil {
			writeEnvdError(w, 0, err)
			return
		}
		g.proxyPort(w, r, sb, port)
	})
}

// Close releases every sandbox the gateway created (the daemon is stopping).
func (g *Gateway) Close(ctx context.Context) {
	g.mu.Lock()
	g.closed = true
	sbs := make([]*sandbox, 0, len(g.sandboxes))
	for _, sb := range g.sandboxes {
		sbs = append(sbs, sb)
	}
	g.mu.Unlock()
	for _, sb := range sbs {
		sb.stopTimer()
	}
}

// tenant authenticates the control-plane request by its X-API-KEY header.
func (g *Gateway) tenant(r *http.Request) (string, error) {
	key := r.Header.Get("X-API-KEY")
	if key == "" {
		if auth := r.Header.Get("Authorization"); strings.HasPrefix(auth, "Bearer ") {
			key = strings.TrimPrefix(auth, "Bearer ")
		}
	}
	if key == "" {
		return "", fmt.Errorf("missing API key (X-API-KEY header): %w", errUnauthenticated)
	}
	sum := sha256.Sum256([]byte(key))
	for k, t := range g.keys { // constant time per key
		if subtle.ConstantTimeCompare(k[:], sum[:]) == 1 {
			return t, nil
		}
	}
	return "", fmt.Errorf("invalid API key: %w", errUnauthenticated)
}

// owned returns the tenant's sandbox id; another tenant's sandbox is not found.
func (g *Gateway) owned(tenant, id string) (*sandbox, error) {
	g.mu.Lock()
	sb := g.sandboxes[id]
	g.mu.Unlock()
	if sb == nil || sb.tenant != tenant || g.forgetGone(sb) {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// forgetGone drops the record of a sandbox released by other means (the host API, a pool
// removal) and reports whether it did.
func (g *Gateway) forgetGone(sb *sandbox) bool {
	if _, err := g.b.Sandbox(sb.id); !errdefs.IsNotFound(err) {
		return false
	}
	sb.mu.Lock()
	sb.gone = true
	if sb.timer != nil {
		sb.timer.Stop()
	}
	sb.mu.Unlock()
	sb.cancel()
	g.mu.Lock()
	if g.sandboxes[sb.id] == sb {
		delete(g.sandboxes, sb.id)
	}
	g.mu.Unlock()
	return true
}

// envdSandbox authenticates an in-sandbox request: the E2b-Sandbox-Id header names a
// sandbox of this gateway and X-Access-Token carries its access token.
func (g *Gateway) envdSandbox(r *http.Request) (*sandbox, error) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" { // the SDK without E2B_SANDBOX_URL names the sandbox in the host: PORT-ID.DOMAIN
		id, _ = sandboxFromHost(r.Host)
	}
	if id == "" {
		return nil, fmt.Errorf("missing E2b-Sandbox-Id header (set E2B_SANDBOX_URL to this gateway): %w", errdefs.ErrInvalidArgument)
	}
	g.mu.Lock()
	sb := g.sandboxes[id]
	g.mu.Unlock()
	tok := r.Header.Get("X-Access-Token")
	if tok == "" {
		tok = r.Header.Get(TrafficTokenHeader)
	}
	if sb == nil || !sb.tokenOK(tok) {
		return nil, fmt.Errorf("sandbox %q: unknown sandbox or wrong access token: %w", id, errUnauthenticated)
	}
	if sb.isPaused() {
		return nil, fmt.Errorf("sandbox %q is paused; connect to resume it: %w", id, errdefs.ErrUnavailable)
	}
	return sb, nil
}

// sandboxFromHost reads PORT-ID from the first label of a host name ("49983-sb-1.e2b.example").
func sandboxFromHost(host string) (id, port string) {
	label, _, ok := strings.Cut(host, ".")
	if !ok {
		return "", ""
	}
	port, id, ok = strings.Cut(label, "-")
	if !ok || port == "" || strings.Trim(port, "0123456789") != "" {
		return "", ""
	}
	return id, port
}

// tokenOK checks an in-sandbox call's access token (by hash, in constant time per token).
func (sb *sandbox) tokenOK(tok string) bool {
	if tok == "" {
		return false
	}
	h := []byte(tokenHash(tok))
	sb.mu.Lock()
	defer sb.mu.Unlock()
	ok := false
	for _, want := range sb.tokenHash {
		ok = subtle.ConstantTimeCompare(h, []byte(want)) == 1 || ok
	}
	return ok
}

func randomToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func splitLines(s string) []string { return strings.Split(s, "\n") }
func splitColon(s string) []string { return strings.Split(s, ":") }
