package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

// Connection limits. Every connection a sandbox opens to the proxy (explicit, transparent,
// and the tunnels inside them, which reuse it) counts against its source address until it is
// closed; beyond WithConnLimits' maximum new ones are refused at once, so a sandbox holding
// thousands of idle connections cannot exhaust the node's file descriptors or memory. Idle
// keep-alive connections, slow request headers and slow request bodies are cut by the
// server's timeouts (newServer).

// connLimiter counts open connections per source address.
type connLimiter struct {
	mu   sync.Mutex
	max  int
	open map[netip.Addr]int
}

func newConnLimiter(max int) *connLimiter {
	return &connLimiter{max: max, open: map[netip.Addr]int{}}
}

// acquire counts a connection from src, or reports false if src is at its maximum.
func (l *connLimiter) acquire(src netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.open[src] >= l.max {
		return false
	}
	l.open[src]++
	return true
}

func (l *connLimiter) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[src]--; l.open[src] <= 0 {
		delete(l.open, src)
	}
}

// count returns the open connections from src.
func (l *connLimiter) count(src netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[src]
}

// countedConn releases its slot once, when it is first closed (by whichever layer).
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// admit wraps a freshly accepted connection in its source's count, or refuses it (with a
// 429 answer on the explicit proxy port, where the client speaks HTTP first) and returns nil.
func (p *Proxy) admit(ctx context.Context, c net.Conn, explicit bool) net.Conn {
	src := sourceAddr(c)
	if !p.limiter.acquire(src) {
		p.metrics.connRefused()
		log.L(ctx).Warn("proxy: connection refused: too many open connections", "src", src, "max", p.limiter.max)
		if explicit {
			_, _ = c.Write([]byte("HTTP/1.1 429 Too Many Requests\r\n" + HeaderReason + ": too many open connections from " +
				src.String() + "\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
		}
		c.Close()
		return nil
	}
	return &countedConn{Conn: c, release: func() { p.limiter.release(src) }}
}

// readBodyOrRefuse is readWholeBody for a handler: it logs the bytes read and, when the body
// cannot be read whole, refuses the request and returns false.
func (p *Proxy) readBodyOrRefuse(w http.ResponseWriter, r *http.Request, rl *reqLog) ([]byte, bool) {
	body, rerr := p.readWholeBody(w, r)
	rl.bytes = int64(len(body))
	if rerr != nil {
		p.refuse(w, rl, rerr.status, rerr.reason)
		return nil, false
	}
	return body, true
}

// readWholeBody reads a request body that is journaled (held or compensated): all of it
// within the body timeout.
func (p *Proxy) readWholeBody(w http.ResponseWriter, r *http.Request) ([]byte, *requestError) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(p.cfg.bodyTimeout))
	body, rerr := readBody(r, p.cfg.bodyLimit)
	if rerr == nil {
		_ = rc.SetReadDeadline(time.Time{})
		return body, nil
	}
	// The deadline stays: the server must not wait for the rest of the body to answer.
	w.Header().Set("Connection", "close")
	if errors.Is(rerr.cause, os.ErrDeadlineExceeded) {
		rerr = reject(http.StatusRequestTimeout, "request body not received within %s", p.cfg.bodyTimeout)
	}
	return nil, rerr
}

// pacedBody streams a passed request's body, allowing at most the body timeout between
// reads; the deadline is lifted at its end so that a long answer (server-sent events) is not
// cut by it.
func (p *Proxy) pacedBody(w http.ResponseWriter, r *http.Request) io.ReadCloser {
	if r.Body == nil || r.Body == http.NoBody {
		return r.Body
	}
	return &pacedReader{ReadCloser: r.Body, rc: http.NewResponseController(w), d: p.cfg.bodyTimeout}
}

type pacedReader struct {
	io.ReadCloser
	rc *http.ResponseController
	d  time.Duration
}

func (b *pacedReader) Read(buf []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.d))
	n, err := b.ReadCloser.Read(buf)
	if err != nil {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
