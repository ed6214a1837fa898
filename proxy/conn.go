package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
)

// connMode says how a connection reached the proxy, which decides how a request's target is
// found.
type connMode int

const (
	modeForward     connMode = iota // explicit proxy: absolute-form requests and CONNECT
	modeTunnel                      // inside a CONNECT tunnel (TLS intercepted or plain)
	modeTransparent                 // redirected by the firewall; target from Host/SNI
)

// connMeta is what the proxy knows about a connection before reading a request from it.
type connMeta struct {
	mode   connMode
	src    netip.Addr // the sandbox's identity
	host   string     // CONNECT authority host, or the SNI on a transparent TLS connection
	port   int        // CONNECT authority port, or the original destination port
	sni    string     // TLS server name the client sent, "" without TLS or without SNI
	tls    bool
	origIP netip.Addr      // transparent: the original destination address
	base   context.Context // the context of the Serve call that accepted the connection
}

type metaKey struct{}

func withMeta(ctx context.Context, m *connMeta) context.Context {
	return context.WithValue(ctx, metaKey{}, m)
}

func metaFrom(ctx context.Context) *connMeta {
	m, _ := ctx.Value(metaKey{}).(*connMeta)
	return m
}

// metaConn is a connection handed to the proxy's HTTP server, with what is known about it and
// the context (logger, cancellation) of the Serve call that accepted it.
type metaConn struct {
	net.Conn
	r    io.Reader // reads through whatever was already buffered (peeked) from Conn
	meta *connMeta
	ctx  context.Context
}

func (c *metaConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// bufferedConn reads through a bufio.Reader that may hold bytes already read from Conn.
type bufferedConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.br.Read(b) }

// chanListener is the net.Listener of the proxy's one HTTP server: every accepted, hijacked
// and intercepted connection is pushed into it.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// push hands c to the server, or closes it when the listener is closed.
func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// sourceAddr returns the IP a connection comes from, unmapped.
func sourceAddr(c net.Conn) netip.Addr {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
