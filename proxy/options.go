package proxy

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultBodyLimit bounds the request bodies the proxy journals (and buffers for compensation).
const DefaultBodyLimit = 10 << 20

// Resolver resolves host names; *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer opens upstream connections; *net.Dialer satisfies it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// OriginalDstFunc returns the destination a transparently redirected connection was sent to.
type OriginalDstFunc func(c net.Conn) (netip.AddrPort, error)

type config struct {
	stateDir         string
	listenAddrs      []string
	transparentAddr  []string
	extraRootsPEM    [][]byte
	bodyLimit        int64
	leafCacheSize    int
	resolver         Resolver
	dialer           Dialer
	clock            func() time.Time
	registerer       prometheus.Registerer
	originalDst      OriginalDstFunc
	commitAttempts   int
	commitBackoff    time.Duration
	commitBackoffMax time.Duration
	commitTimeout    time.Duration
	recordPassed     bool
	journalLimit     int64
	nodeAddrs        NodeAddrsFunc
	gateways         []netip.Addr
	maxConns         int
	headerTimeout    time.Duration
	bodyTimeout      time.Duration
	idleTimeout      time.Duration
}

// Option configures New.
type Option func(*config)

// WithStateDir sets the directory of the CA (ca/) and the effect journals (journal/). Required.
func WithStateDir(dir string) Option { return func(c *config) { c.stateDir = dir } }

// WithListenAddr adds a forward-proxy listen address (host:port) used by Start.
func WithListenAddr(addr string) Option {
	return func(c *config) { c.listenAddrs = append(c.listenAddrs, addr) }
}

// WithTransparentAddr adds a listen address for transparently redirected connections
// (iptables REDIRECT), used by Start.
func WithTransparentAddr(addr string) Option {
	return func(c *config) { c.transparentAddr = append(c.transparentAddr, addr) }
}

// WithUpstreamRootsPEM adds PEM CA certificates trusted for upstream TLS on top of the
// system roots.
func WithUpstreamRootsPEM(pem []byte) Option {
	return func(c *config) { c.extraRootsPEM = append(c.extraRootsPEM, pem) }
}

// WithBodyLimit bounds journaled request bodies (default DefaultBodyLimit); larger held or
// compensated requests get 413.
func WithBodyLimit(n int64) Option { return func(c *config) { c.bodyLimit = n } }

// WithLeafCacheSize bounds the number of intercepted hosts' certificates kept (default 1024).
func WithLeafCacheSize(n int) Option { return func(c *config) { c.leafCacheSize = n } }

// WithResolver replaces the system resolver (tests).
func WithResolver(r Resolver) Option { return func(c *config) { c.resolver = r } }

// WithDialer replaces the upstream dialer (tests).
func WithDialer(d Dialer) Option { return func(c *config) { c.dialer = d } }

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.clock = now } }

// WithRegisterer registers the proxy's metrics with reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(c *config) { c.registerer = reg }
}

// WithOriginalDst replaces SO_ORIGINAL_DST lookups on transparent connections (tests).
func WithOriginalDst(f OriginalDstFunc) Option { return func(c *config) { c.originalDst = f } }

// WithCommitRetry sets the attempts per effect on commit (default 5; a retry by the operator
// grants as many again) and the wait before the second attempt (default 100ms, doubling up to
// WithCommitBackoffMax).
func WithCommitRetry(attempts int, backoff time.Duration) Option {
	return func(c *config) {
		if attempts > 0 {
			c.commitAttempts = attempts
		}
		if backoff > 0 {
			c.commitBackoff = backoff
		}
	}
}

// WithCommitBackoffMax caps the doubling wait between attempts (default 10s).
func WithCommitBackoffMax(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.commitBackoffMax = d
		}
	}
}

// WithCommitTimeout bounds each attempt to send an effect: connect, TLS, the answer and its
// body (default 30s). A black-holed upstream costs at most attempts x (timeout + backoff).
func WithCommitTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.commitTimeout = d
		}
	}
}

// ConnLimits bound what one sandbox (source address) may hold open at the proxy.
type ConnLimits struct {
	MaxConns      int           // open connections per sandbox (default 256); beyond it new ones are refused
	HeaderTimeout time.Duration // to read a request's headers, from the first byte of the connection or request (default 30s)
	BodyTimeout   time.Duration // a held or compensated request's whole body; a passed one's longest pause (default 60s)
	IdleTimeout   time.Duration // a keep-alive connection waiting for its next request (default 2m)
}

// WithConnLimits sets the per-sandbox connection limits; zero fields keep their defaults.
func WithConnLimits(l ConnLimits) Option {
	return func(c *config) {
		if l.MaxConns > 0 {
			c.maxConns = l.MaxConns
		}
		if l.HeaderTimeout > 0 {
			c.headerTimeout = l.HeaderTimeout
		}
		if l.BodyTimeout > 0 {
			c.bodyTimeout = l.BodyTimeout
		}
		if l.IdleTimeout > 0 {
			c.idleTimeout = l.IdleTimeout
		}
	}
}

// WithNodeAddrs replaces the listing of the node's own interface addresses, which the proxy
// refuses to dial unless a rule names them (tests; default: every interface, listed at each
// check).
func WithNodeAddrs(f NodeAddrsFunc) Option { return func(c *config) { c.nodeAddrs = f } }

// WithGateway makes the proxy refuse a (the sandbox network's gateway, where the proxy and
// the daemon listen) unless a rule names it, even if it is not an interface address yet.
func WithGateway(a netip.Addr) Option {
	return func(c *config) { c.gateways = append(c.gateways, a.Unmap()) }
}

// WithRecordPassed also journals passed requests (method and URL, not durably); off by
// default because reads are the bulk of the traffic.
func WithRecordPassed(on bool) Option { return func(c *config) { c.recordPassed = on } }

// WithJournalLimit bounds a sandbox's journal file (default 1 GiB): a hostile sandbox cannot
// fill the disk. New effects beyond it are refused with 507; commit and rollback still work.
// Compaction (compact.go) drops the bodies of finished effects; held ones count until sent.
func WithJournalLimit(n int64) Option { return func(c *config) { c.journalLimit = n } }

func defaultConfig() config {
	return config{
		bodyLimit:        DefaultBodyLimit,
		leafCacheSize:    1024,
		resolver:         net.DefaultResolver,
		dialer:           &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		clock:            time.Now,
		originalDst:      originalDst,
		commitAttempts:   5,
		commitBackoff:    100 * time.Millisecond,
		commitBackoffMax: 10 * time.Second,
		commitTimeout:    30 * time.Second,
		journalLimit:     1 << 30,
		nodeAddrs:        interfacePrefixes,
		maxConns:         256,
		headerTimeout:    30 * time.Second,
		bodyTimeout:      60 * time.Second,
		idleTimeout:      2 * time.Minute,
	}
}
