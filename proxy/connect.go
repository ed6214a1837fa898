package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

const (
	handshakeTimeout = 10 * time.Second
	firstByteTimeout = 30 * time.Second
)

// handleConnect opens a tunnel: it answers 200, then intercepts TLS (or reads plain HTTP)
// inside it, so every inner request goes through the policy like any other.
func (p *Proxy) handleConnect(w http.ResponseWriter, r *http.Request, m *connMeta, rl *reqLog) {
	rl.decision = "connect"
	if m.mode != modeForward {
		rl.decision = "reject"
		p.refuse(w, rl, http.StatusBadRequest, "CONNECT inside a tunnel")
		return
	}
	host, port, err := splitHostPort(r.Host, 0)
	if err != nil || port == 0 {
		rl.decision = "reject"
		p.refuse(w, rl, http.StatusBadRequest, "CONNECT needs host:port")
		return
	}
	rl.host = host
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.refuse(w, rl, http.StatusInternalServerError, "cannot take over the connection")
		return
	}
	_ = conn.SetDeadline(time.Time{})
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection Established\r\n\r\n")); err != nil {
		conn.Close()
		return
	}
	rl.status = http.StatusOK
	inner := &connMeta{mode: modeTunnel, src: m.src, host: host, port: port, base: m.base}
	p.intercept(m.base, conn, brw.Reader, inner)
}

// intercept looks at the first byte of a tunnel or transparent connection: TLS is terminated
// with a certificate from the node CA, anything else is served as plain HTTP.
func (p *Proxy) intercept(ctx context.Context, raw net.Conn, br *bufio.Reader, m *connMeta) {
	_ = raw.SetReadDeadline(time.Now().Add(firstByteTimeout))
	first, err := br.Peek(1)
	_ = raw.SetReadDeadline(time.Time{})
	if err != nil {
		raw.Close()
		return
	}
	bc := &bufferedConn{Conn: raw, br: br}
	if first[0] != 0x16 { // not a TLS handshake record
		p.conns.push(&metaConn{Conn: bc, r: bc, meta: m, ctx: ctx})
		return
	}
	tc := tls.Server(bc, p.tlsConfig(m))
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		log.L(ctx).Debug("proxy: TLS handshake with sandbox failed", "src", m.src, "host", m.host, "error", err)
		tc.Close()
		return
	}
	m.tls, m.sni = true, tc.ConnectionState().ServerName
	p.conns.push(&metaConn{Conn: tc, r: tc, meta: m, ctx: ctx})
}

// tlsConfig serves a leaf for the CONNECT authority (a tunnel) or for the SNI (transparent).
// Only HTTP/1.1 is offered, so no request escapes the per-request policy inside h2.
func (p *Proxy) tlsConfig(m *connMeta) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if m.mode == modeTransparent && hello.ServerName != "" {
				host := normalizeHost(hello.ServerName)
				if host == "" {
					return nil, fmt.Errorf("invalid server name %q", sanitize(hello.ServerName))
				}
				m.host = host
			}
			return p.ca.leaf(m.host)
		},
	}
}

// acceptTransparent serves a connection redirected by the firewall.
func (p *Proxy) acceptTransparent(ctx context.Context, raw net.Conn) {
	c := p.admit(ctx, raw, false)
	if c == nil {
		return
	}
	dst, err := p.cfg.originalDst(raw)
	if err != nil {
		log.L(ctx).Warn("proxy: transparent connection without an original destination", "src", raw.RemoteAddr().String(), "error", err)
		c.Close()
		return
	}
	ip := dst.Addr().Unmap()
	m := &connMeta{mode: modeTransparent, src: sourceAddr(raw), host: ip.String(), port: int(dst.Port()), origIP: ip, base: ctx}
	p.intercept(ctx, c, bufio.NewReader(c), m)
}

// acceptForward hands an explicit-proxy connection to the server.
func (p *Proxy) acceptForward(ctx context.Context, raw net.Conn) {
	c := p.admit(ctx, raw, true)
	if c == nil {
		return
	}
	p.conns.push(&metaConn{Conn: c, r: c, meta: &connMeta{mode: modeForward, src: sourceAddr(raw), base: ctx}, ctx: ctx})
}
