package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

// testEnv is a running proxy on 127.0.0.1 with its state in a temp dir.
type testEnv struct {
	t      testing.TB
	p      *Proxy
	dir    string
	addr   string
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func testContext() context.Context {
	h := slog.DiscardHandler
	if os.Getenv("PROXY_TEST_LOG") != "" {
		h = slog.NewTextHandler(os.Stderr, nil)
	}
	return log.WithLogger(context.Background(), slog.New(h))
}

func newEnv(t testing.TB, opts ...Option) *testEnv {
	t.Helper()
	return newEnvAt(t, t.TempDir(), opts...)
}

func newEnvAt(t testing.TB, dir string, opts ...Option) *testEnv {
	t.Helper()
	base := []Option{WithStateDir(dir), WithCommitRetry(4, 5*time.Millisecond)}
	p, err := New(append(base, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testContext())
	e := &testEnv{t: t, p: p, dir: dir, addr: l.Addr().String(), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		if err := p.Serve(ctx, l); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(e.close)
	return e
}

// close stops the proxy (idempotent), like a process exit.
func (e *testEnv) close() {
	e.cancel()
	<-e.done
	_ = e.p.Close()
}

// register registers sandbox id at 127.0.0.<n> with a YAML policy ("" for nil).
func (e *testEnv) register(n int, id, policy string) {
	e.t.Helper()
	var pol *Policy
	if policy != "" {
		var err error
		if pol, err = ParsePolicy([]byte(policy)); err != nil {
			e.t.Fatalf("ParsePolicy: %v", err)
		}
	}
	if err := e.p.RegisterSandbox(srcIP(n), SandboxConfig{ID: id, Policy: pol}); err != nil {
		e.t.Fatal(err)
	}
}

func srcIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(n)}) }

// client is an HTTP client that talks through the proxy from 127.0.0.<n> and trusts the
// proxy's CA (and nothing else).
func (e *testEnv) client(n int) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.p.CACertPEM())
	proxyURL := &url.URL{Scheme: "http", Host: e.addr}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: srcIP(n).AsSlice()}, Timeout: 5 * time.Second}
	tr := &http.Transport{
		Proxy: http.ProxyURL(proxyURL), DialContext: d.DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2:   true, // the proxy must still answer HTTP/1.1
		MaxIdleConnsPerHost: 64,
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	e.t.Cleanup(tr.CloseIdleConnections)
	return c
}

// dialFrom opens a raw TCP connection to addr from 127.0.0.<n>.
func dialFrom(t testing.TB, n int, addr string) net.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: srcIP(n).AsSlice()}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// seen is one request an upstream received.
type seen struct {
	Method, Path, Body, Key string
}

// upstream is a local server that records what it receives. It honours Idempotency-Key: a
// repeated key is answered like the first time and not counted as a new effect.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	reqs     []seen
	keys     map[string]int
	fail5xx  int           // answer the next n requests with 503
	block    chan struct{} // if set, /slow requests wait on it
	received chan string   // if set, gets every Idempotency-Key on arrival
}

func newUpstream(t testing.TB, useTLS bool) *upstream {
	u := &upstream{keys: map[string]int{}}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	if useTLS {
		u.StartTLS()
	} else {
		u.Start()
	}
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	if u.received != nil {
		u.received <- key
	}
	if u.fail5xx > 0 {
		u.fail5xx--
		u.mu.Unlock()
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	dup := key != "" && u.keys[key] > 0
	if key != "" {
		u.keys[key]++
	}
	if !dup {
		u.reqs = append(u.reqs, seen{Method: r.Method, Path: r.URL.Path, Body: string(body), Key: key})
	}
	block := u.block
	u.mu.Unlock()
	if block != nil && strings.HasPrefix(r.URL.Path, "/slow") {
		<-block
	}
	u.answer(w, r)
}

func (u *upstream) answer(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/charge"):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id": "ch_%s", "ok": true}`, strings.TrimPrefix(r.URL.Path, "/charge/"))
	case r.URL.Path == "/big":
		_, _ = w.Write(bytes.Repeat([]byte("x"), 1<<20))
	default:
		fmt.Fprintf(w, "hello %s %s", r.Method, r.URL.Path)
	}
}

func (u *upstream) seen() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

func (u *upstream) hostPort() string { return u.Listener.Addr().String() }

// certPEM is the upstream's certificate as PEM, to trust it for upstream TLS.
func (u *upstream) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.Certificate().Raw})
}

// mapResolver resolves names from a map (tests never use DNS).
type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// basePolicy passes reads, holds writes and compensates /charge, all on 127.0.0.1.
func basePolicy(refundHost string) string {
	return `version: 1
default: deny
rules:
  - host: 127.0.0.1
    methods: [GET, HEAD]
    action: pass
  - host: 127.0.0.1
    methods: [POST]
    path_prefix: /charge
    action: compensate
    compensate:
      method: POST
      url: 'http://` + refundHost + `/refund/{{.Response.JSON.id}}'
      body: '{"amount": {{.Request.JSON.amount}}}'
      headers: {Content-Type: application/json}
  - host: 127.0.0.1
    methods: [POST, PUT]
    action: hold
`
}

func mustStatus(t testing.TB, resp *http.Response, want int) string {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("status %d (reason %q, body %q), want %d", resp.StatusCode, resp.Header.Get(HeaderReason), body, want)
	}
	return string(body)
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
