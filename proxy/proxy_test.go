package proxy

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestPassGETHTTP(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	resp, err := e.client(2).Get(up.URL + "/hello?x=1")
	if err != nil {
		t.Fatal(err)
	}
	if body := mustStatus(t, resp, 200); body != "hello GET /hello" {
		t.Fatalf("body %q", body)
	}
	if got := up.seen(); len(got) != 1 || got[0].Path != "/hello" {
		t.Fatalf("upstream saw %+v", got)
	}
	if n := len(e.p.Effects("sb-a")); n != 0 {
		t.Fatalf("a pass journaled %d effects", n)
	}
}

func TestPassGETHTTPSIntercepted(t *testing.T) {
	up := newUpstream(t, true)
	e := newEnv(t, WithUpstreamRootsPEM(up.certPEM()))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	resp, err := e.client(2).Get(up.URL + "/secure")
	if err != nil {
		t.Fatal(err)
	}
	if body := mustStatus(t, resp, 200); body != "hello GET /secure" {
		t.Fatalf("body %q", body)
	}
	if resp.TLS == nil || resp.TLS.NegotiatedProtocol == "h2" || resp.ProtoMajor != 1 {
		t.Fatalf("want HTTP/1.1 over TLS to the sandbox, got %s tls=%v", resp.Proto, resp.TLS)
	}
	issuer := resp.TLS.PeerCertificates[0].Issuer.CommonName
	if !strings.HasPrefix(issuer, "DeltaBox egress CA") {
		t.Fatalf("leaf issued by %q, not the node CA", issuer)
	}
	if len(up.seen()) != 1 {
		t.Fatalf("upstream saw %d requests", len(up.seen()))
	}
}

func TestNoPolicyDeniesLoopback(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", "")
	resp, err := e.client(2).Get(up.URL + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusForbidden)
	if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "loopback") {
		t.Fatalf("reason %q does not say loopback", r)
	}
	if len(up.seen()) != 0 {
		t.Fatal("upstream was reached")
	}
}

func TestWildcardDoesNotUnlockPrivate(t *testing.T) {
	up := newUpstream(t, false)
	_, port, _ := net.SplitHostPort(up.hostPort())
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	e := newEnv(t, WithResolver(mapResolver{"api.test": lo, "evil.test": lo}))
	e.register(2, "sb-a", "version: 1\nrules:\n  - {host: api.test, action: pass}\n  - {host: '*.test', action: pass}\n")
	c := e.client(2)
	resp, err := c.Get("http://api.test:" + port + "/named")
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, 200)
	resp, err = c.Get("http://evil.test:" + port + "/rebound")
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusForbidden)
	if got := up.seen(); len(got) != 1 || got[0].Path != "/named" {
		t.Fatalf("upstream saw %+v", got)
	}
}

func TestDeniedByPolicy(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	req, _ := http.NewRequest(http.MethodDelete, up.URL+"/thing", nil)
	resp, err := e.client(2).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusForbidden)
	if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "denied by policy default") {
		t.Fatalf("reason %q", r)
	}
	if len(up.seen()) != 0 {
		t.Fatal("upstream was reached")
	}
}

func TestUnknownSource(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	resp, err := e.client(9).Get(up.URL + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusForbidden)
	if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "unknown source") {
		t.Fatalf("reason %q", r)
	}
	// CONNECT from an unknown source is refused too.
	tlsUp := newUpstream(t, true)
	if _, err := e.client(9).Get(tlsUp.URL + "/x"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("CONNECT from unknown source: %v", err)
	}
	e.p.UnregisterSandbox(srcIP(2))
	resp, err = e.client(2).Get(up.URL + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusForbidden)
	if len(up.seen()) != 0 || len(tlsUp.seen()) != 0 {
		t.Fatal("upstream was reached")
	}
}

func TestMalformedRequests(t *testing.T) {
	e := newEnv(t)
	e.register(2, "sb-a", "")
	for _, raw := range []string{
		"GARBAGE\r\n\r\n",
		"GET /relative HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"GET http://bad_host!/ HTTP/1.1\r\nHost: bad_host!\r\n\r\n",
		"CONNECT nohostport HTTP/1.1\r\nHost: nohostport\r\n\r\n",
	} {
		c := dialFrom(t, 2, e.addr)
		if _, err := c.Write([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		mustStatus(t, resp, http.StatusBadRequest)
	}
}

// connectTLS opens a CONNECT tunnel to authority and a TLS session with the given SNI.
func connectTLS(t *testing.T, e *testEnv, authority, sni string, verify bool) net.Conn {
	t.Helper()
	c := dialFrom(t, 2, e.addr)
	if _, err := c.Write([]byte("CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.p.CACertPEM())
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: pool, InsecureSkipVerify: !verify})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return tc
}

func roundTripRaw(t *testing.T, c net.Conn, raw string) *http.Response {
	t.Helper()
	if _, err := c.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestConnectAuthorityMismatch(t *testing.T) {
	up := newUpstream(t, true)
	e := newEnv(t, WithUpstreamRootsPEM(up.certPEM()))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	authority := up.hostPort()

	tc := connectTLS(t, e, authority, "127.0.0.1", true)
	resp := roundTripRaw(t, tc, "GET /x HTTP/1.1\r\nHost: evil.example\r\n\r\n")
	mustStatus(t, resp, http.StatusMisdirectedRequest)
	if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "does not match CONNECT authority") {
		t.Fatalf("reason %q", r)
	}

	tc = connectTLS(t, e, authority, "evil.example", false)
	resp = roundTripRaw(t, tc, "GET /x HTTP/1.1\r\nHost: "+authority+"\r\n\r\n")
	mustStatus(t, resp, http.StatusMisdirectedRequest)
	if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "TLS server name") {
		t.Fatalf("reason %q", r)
	}

	tc = connectTLS(t, e, authority, "127.0.0.1", true)
	resp = roundTripRaw(t, tc, "GET /ok HTTP/1.1\r\nHost: "+authority+"\r\n\r\n")
	mustStatus(t, resp, http.StatusOK)
	if got := up.seen(); len(got) != 1 || got[0].Path != "/ok" {
		t.Fatalf("upstream saw %+v", got)
	}
}

// selfSignedServer is a TLS upstream whose certificate nobody trusts.
func selfSignedServer(t *testing.T) *httptest.Server {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(), Subject: pkix.Name{CommonName: "rogue"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("untrusted upstream got a request %s", r.URL)
	}))
	s.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func TestUpstreamTLSFailure(t *testing.T) {
	s := selfSignedServer(t)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy("127.0.0.1:1"))
	resp, err := e.client(2).Get(s.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusBadGateway)
	if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "upstream TLS failure") {
		t.Fatalf("reason %q", r)
	}
}

func TestTransparentHTTPAndTLS(t *testing.T) {
	up := newUpstream(t, false)
	tlsUp := newUpstream(t, true)
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	var dst atomic.Pointer[netip.AddrPort]
	e := newEnv(t, WithResolver(mapResolver{"example.com": lo}), WithUpstreamRootsPEM(tlsUp.certPEM()),
		WithOriginalDst(func(net.Conn) (netip.AddrPort, error) { return *dst.Load(), nil }))
	e.register(2, "sb-a", basePolicy(up.hostPort())+"  - {host: example.com, action: pass}\n")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.p.ServeTransparent(e.ctx, l) }()

	plainDst := netip.MustParseAddrPort(up.hostPort())
	dst.Store(&plainDst)
	c := dialFrom(t, 2, l.Addr().String())
	resp := roundTripRaw(t, c, "GET /plain HTTP/1.1\r\nHost: "+up.hostPort()+"\r\n\r\n")
	if body := mustStatus(t, resp, 200); body != "hello GET /plain" {
		t.Fatalf("body %q", body)
	}

	tlsDst := netip.MustParseAddrPort(tlsUp.hostPort())
	dst.Store(&tlsDst)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.p.CACertPEM())
	tc := tls.Client(dialFrom(t, 2, l.Addr().String()), &tls.Config{ServerName: "example.com", RootCAs: pool})
	resp = roundTripRaw(t, tc, "GET /sni HTTP/1.1\r\nHost: example.com\r\n\r\n")
	if body := mustStatus(t, resp, 200); body != "hello GET /sni" {
		t.Fatalf("body %q", body)
	}
	if len(up.seen()) != 1 || len(tlsUp.seen()) != 1 {
		t.Fatalf("upstreams saw %v and %v", up.seen(), tlsUp.seen())
	}
}

func TestCAPersistsAndIsPrivate(t *testing.T) {
	dir := t.TempDir()
	p1, err := New(WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	pem1 := p1.CACertPEM()
	p1.Close()
	st, err := os.Stat(filepath.Join(dir, "ca", caKeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v mode %v", err, st.Mode())
	}
	p2, err := New(WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if string(p2.CACertPEM()) != string(pem1) {
		t.Fatal("CA changed across restarts")
	}
	if err := os.Chmod(filepath.Join(dir, "ca", caKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(WithStateDir(dir)); err == nil {
		t.Fatal("New accepted a world-readable CA key")
	}
}

func TestMetrics(t *testing.T) {
	up := newUpstream(t, false)
	reg := prometheus.NewRegistry()
	e := newEnv(t, WithRegisterer(reg))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	resp, _ := c.Get(up.URL + "/a")
	mustStatus(t, resp, 200)
	resp, _ = c.Post(up.URL+"/b", "text/plain", strings.NewReader("x"))
	mustStatus(t, resp, http.StatusAccepted)
	req, _ := http.NewRequest(http.MethodDelete, up.URL+"/c", nil)
	resp, _ = c.Do(req)
	mustStatus(t, resp, http.StatusForbidden)
	for d, want := range map[string]float64{"pass": 1, "hold": 1, "deny": 1} {
		var m dto.Metric
		if err := e.p.metrics.decisions.WithLabelValues(d).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetCounter().GetValue(); got != want {
			t.Errorf("decisions{%s} = %v, want %v", d, got, want)
		}
	}
}
