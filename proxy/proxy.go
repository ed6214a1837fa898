package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// SandboxConfig is what the proxy knows about the sandbox behind a source address.
type SandboxConfig struct {
	ID     string
	Policy *Policy // nil: GET, HEAD and OPTIONS pass, everything else is held
}

type sandbox struct {
	id     string
	policy *Policy
}

// Proxy is the node's egress proxy. Create it with New, serve listeners with Serve and
// ServeTransparent (or Start), and Close it when done.
type Proxy struct {
	cfg        config
	ca         *authority
	roots      *x509.CertPool
	metrics    *metrics
	journalDir string
	rec        recorder // kept answers for replay (replay.go)

	mu         sync.RWMutex
	byIP       map[netip.Addr]*sandbox
	journals   map[string]*journal
	transports map[string]*http.Transport

	conns     *chanListener
	limiter   *connLimiter
	srv       *http.Server
	listeners []net.Listener
	closeOnce sync.Once
}

// New creates the proxy: it loads (or creates) the node CA and loads every journal under the
// state dir. It does not resume interrupted commits; call ResumeCommits for that.
func New(opts ...Option) (*Proxy, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.stateDir == "" {
		return nil, fmt.Errorf("proxy: state dir is required: %w", errdefs.ErrInvalidArgument)
	}
	p := &Proxy{
		cfg: cfg, journalDir: filepath.Join(cfg.stateDir, "journal"), byIP: map[netip.Addr]*sandbox{},
		journals: map[string]*journal{}, transports: map[string]*http.Transport{}, conns: newChanListener(),
		limiter: newConnLimiter(cfg.maxConns),
	}
	var err error
	if p.ca, err = loadOrCreateCA(filepath.Join(cfg.stateDir, "ca"), cfg.clock, cfg.leafCacheSize); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if p.roots, err = upstreamRoots(cfg.extraRootsPEM); err != nil {
		return nil, err
	}
	if p.metrics, err = newMetrics(cfg.registerer); err != nil {
		return nil, fmt.Errorf("proxy: register metrics: %w", err)
	}
	if err := p.loadJournals(context.Background()); err != nil {
		return nil, err
	}
	p.srv = p.newServer()
	go func() { _ = p.srv.Serve(p.conns) }()
	return p, nil
}

func upstreamRoots(extra [][]byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, pem := range extra {
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("proxy: upstream roots: no certificate in PEM: %w", errdefs.ErrInvalidArgument)
		}
	}
	return pool, nil
}

// newServer is the one HTTP/1.1 server for every connection (explicit, tunnelled and
// transparent); each carries its connMeta and the context of the Serve call that took it.
func (p *Proxy) newServer() *http.Server {
	return &http.Server{
		Handler:           handler{p: p},
		ReadHeaderTimeout: p.cfg.headerTimeout,
		IdleTimeout:       p.cfg.idleTimeout,
		MaxHeaderBytes:    64 << 10,
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:          slog.NewLogLogger(log.L(context.Background()).Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if mc, ok := c.(*metaConn); ok {
				return withMeta(mc.ctx, mc.meta)
			}
			return ctx
		},
	}
}

// Serve runs the explicit (forward) proxy on l until ctx is done or the proxy is closed.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	return p.acceptLoop(ctx, l, p.acceptForward)
}

// ServeTransparent serves connections redirected to l by the firewall (iptables REDIRECT):
// plain HTTP (target from Host) and TLS (target from SNI), both on the original port.
func (p *Proxy) ServeTransparent(ctx context.Context, l net.Listener) error {
	return p.acceptLoop(ctx, l, func(ctx context.Context, c net.Conn) {
		go p.acceptTransparent(ctx, c)
	})
}

func (p *Proxy) acceptLoop(ctx context.Context, l net.Listener, handle func(context.Context, net.Conn)) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return fmt.Errorf("proxy: accept: %w", err)
		}
		handle(ctx, c)
	}
}

// Start listens on the configured addresses and serves them in the background until Close.
func (p *Proxy) Start(ctx context.Context) error {
	serve := func(addr string, fn func(context.Context, net.Listener) error) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("proxy: listen %s: %w", addr, err)
		}
		p.mu.Lock()
		p.listeners = append(p.listeners, l)
		p.mu.Unlock()
		go func() {
			if err := fn(ctx, l); err != nil {
				log.L(ctx).Error("proxy: listener stopped", "addr", addr, "error", err)
			}
		}()
		return nil
	}
	for _, a := range p.cfg.listenAddrs {
		if err := serve(a, p.Serve); err != nil {
			return err
		}
	}
	for _, a := range p.cfg.transparentAddr {
		if err := serve(a, p.ServeTransparent); err != nil {
			return err
		}
	}
	return nil
}

// Addrs returns the addresses Start listens on.
func (p *Proxy) Addrs() []net.Addr {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []net.Addr
	for _, l := range p.listeners {
		out = append(out, l.Addr())
	}
	return out
}

// Close stops serving, closes every connection and the journals.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.conns.Close()
		_ = p.srv.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.listeners {
			l.Close()
		}
		for _, t := range p.transports {
			t.CloseIdleConnections()
		}
		for _, j := range p.journals {
			_ = j.close()
		}
	})
	return nil
}

// CACertPEM returns the node CA certificate for sandboxes to trust.
func (p *Proxy) CACertPEM() []byte { return append([]byte(nil), p.ca.certPEM...) }

var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func checkID(id string) error {
	if !validID.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("sandbox ID %q: %w", sanitize(id), errdefs.ErrInvalidArgument)
	}
	return nil
}

// RegisterSandbox makes connections from ip belong to the sandbox s (replacing any previous
// registration of ip). Its upstream connection pool starts fresh.
func (p *Proxy) RegisterSandbox(ip netip.Addr, s SandboxConfig) error {
	if err := checkID(s.ID); err != nil {
		return err
	}
	if !ip.IsValid() {
		return fmt.Errorf("register sandbox %s: invalid IP: %w", s.ID, errdefs.ErrInvalidArgument)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.byIP[ip.Unmap()] = &sandbox{id: s.ID, policy: s.Policy}
	if t := p.transports[s.ID]; t != nil {
		t.CloseIdleConnections()
	}
	p.transports[s.ID] = p.newTransport()
	return nil
}

// UnregisterSandbox forgets ip; its connections get 403 from the next request on.
func (p *Proxy) UnregisterSandbox(ip netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byIP, ip.Unmap())
}

func (p *Proxy) sandboxAt(ip netip.Addr) *sandbox {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.byIP[ip]
}

// transportFor returns the sandbox's upstream transport; sandboxes never share connections.
func (p *Proxy) transportFor(id string) *http.Transport {
	p.mu.RLock()
	t := p.transports[id]
	p.mu.RUnlock()
	if t != nil {
		return t
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if t = p.transports[id]; t == nil {
		t = p.newTransport()
		p.transports[id] = t
	}
	return t
}

// journalFor returns the sandbox's journal, creating it if create is set.
func (p *Proxy) journalFor(ctx context.Context, id string, create bool) (*journal, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	p.mu.RLock()
	j := p.journals[id]
	p.mu.RUnlock()
	if j != nil {
		return j, nil
	}
	if !create {
		return nil, fmt.Errorf("journal of sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if j = p.journals[id]; j != nil {
		return j, nil
	}
	if err := os.MkdirAll(p.journalDir, 0o700); err != nil {
		return nil, fmt.Errorf("create journal dir: %w", err)
	}
	j, err := openJournal(ctx, filepath.Join(p.journalDir, id+".journal"))
	if err != nil {
		return nil, err
	}
	j.limit = p.cfg.journalLimit
	p.journals[id] = j
	return j, nil
}

func (p *Proxy) loadJournals(ctx context.Context) error {
	entries, err := os.ReadDir(p.journalDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("proxy: read journals: %w", err)
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".journal")
		if !ok || e.IsDir() || checkID(id) != nil {
			continue
		}
		if _, err := p.journalFor(ctx, id, true); err != nil {
			return fmt.Errorf("proxy: load journal %s: %w", id, err)
		}
	}
	return nil
}
