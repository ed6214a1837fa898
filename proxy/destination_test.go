package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestBlockedReasonEveryForm(t *testing.T) {
	for ip, want := range map[string]string{
		"127.0.0.1": "loopback", "10.1.2.3": "private", "169.254.169.254": "link-local", "::1": "loopback",
		"0.0.0.0": "this-network", "0.1.2.3": "this-network", "100.100.100.200": "carrier-grade NAT",
		"172.16.0.1": "private", "192.168.1.1": "private", "192.0.0.8": "IETF protocol assignment",
		"192.0.2.2": "documentation", "198.51.100.7": "documentation", "203.0.113.9": "documentation",
		"198.18.0.1": "benchmarking", "198.19.255.255": "benchmarking", "224.0.0.1": "multicast",
		"239.255.255.250": "multicast", "240.0.0.1": "reserved", "255.255.255.255": "broadcast",
		"192.88.99.1": "6to4 relay",
		"::":          "unspecified", "::127.0.0.1": "IPv4-compatible", "::8.8.8.8": "IPv4-compatible",
		"::ffff:192.168.1.1": "private", "::ffff:127.0.0.1": "loopback", "::ffff:192.0.2.2": "documentation",
		"::ffff:0:7f00:1":    "IPv4-translated",
		"64:ff9b::a9fe:a9fe": "NAT64 form of 169.254.169.254 (link-local)", "64:ff9b::7f00:1": "NAT64 form of 127.0.0.1",
		"64:ff9b::c000:202": "NAT64 form of 192.0.2.2", "64:ff9b:1::1": "local-use NAT64",
		"2002:7f00:1::1": "6to4 form of 127.0.0.1", "2002:c000:202::": "6to4 form of 192.0.2.2",
		"2001:0:4136:e378:8000:63bf:3fff:fdd2": "Teredo", "2001:db8::1": "documentation", "3fff::1": "documentation",
		"2001:2::1": "IETF protocol assignment", "100::1": "discard-only",
		"fd00::1": "unique local", "fc00::1": "unique local", "fe80::1": "link-local", "fec0::1": "site-local",
		"ff02::1": "multicast", "4000::1": "reserved", "5f00::1": "SRv6",
		// Global unicast, also when embedded.
		"8.8.8.8": "", "1.1.1.1": "", "2001:4860::8888": "", "64:ff9b::808:808": "", "2002:808:808::1": "",
		"::ffff:8.8.8.8": "",
	} {
		got := blockedReason(mustAddr(ip))
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", ip, got, want)
		}
	}
}

func TestNumericHostFormsRefused(t *testing.T) {
	up := newUpstream(t, false)
	_, port, _ := net.SplitHostPort(up.hostPort())
	// A resolver that reads numbers the way inet_aton does: every numeric form is loopback.
	inetAton := mapResolver{}
	forms := []string{"2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7f000001", "017700000001", "0x7f.0.0.0x1"}
	for _, f := range forms {
		inetAton[f] = []netip.Addr{mustAddr("127.0.0.1")}
	}
	e := newEnv(t, WithResolver(inetAton))
	e.register(2, "sb-a", "version: 1\ndefault: pass\n")
	for _, f := range forms {
		c := dialFrom(t, 2, e.addr)
		resp := roundTripRaw(t, c, "GET http://"+f+":"+port+"/x HTTP/1.1\r\nHost: "+f+":"+port+"\r\n\r\n")
		mustStatus(t, resp, http.StatusBadRequest)
		if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "bad host") {
			t.Errorf("%s: reason %q", f, r)
		}
	}
	if _, err := ParsePolicy([]byte("version: 1\nrules:\n  - {host: '2130706433', action: pass}\n")); err == nil {
		t.Error("a policy rule accepted a numeric host")
	}
	if len(up.seen()) != 0 {
		t.Fatalf("upstream reached: %+v", up.seen())
	}
}

// redirectDialer connects every dial to one local server and records the addresses asked for,
// so that tests can use addresses that do not exist on this machine.
type redirectDialer struct {
	to     string
	mu     sync.Mutex
	dialed []string
}

func (d *redirectDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, addr)
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, d.to)
}

func (d *redirectDialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.dialed)
}

// nodeAddrs is a settable list of the node's interface addresses.
type nodeAddrs struct {
	v atomic.Pointer[[]netip.Prefix]
}

func (n *nodeAddrs) set(ps ...string) {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, netip.MustParsePrefix(p))
	}
	n.v.Store(&out)
}

func (n *nodeAddrs) list() ([]netip.Prefix, error) { return *n.v.Load(), nil }

// publicEnv is a proxy whose upstream dials all land on up, with names from res and the node
// addresses in addrs.
func publicEnv(t *testing.T, up *upstream, res Resolver, addrs *nodeAddrs, opts ...Option) (*testEnv, *redirectDialer) {
	d := &redirectDialer{to: up.hostPort()}
	base := []Option{WithResolver(res), WithDialer(d), WithNodeAddrs(addrs.list)}
	return newEnv(t, append(base, opts...)...), d
}

func getStatus(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(HeaderReason)
}

func TestNodeAddressesRefusedAlsoWhenAddedLater(t *testing.T) {
	up := newUpstream(t, false)
	pub := mustAddr("11.22.33.44")
	addrs := &nodeAddrs{}
	addrs.set("127.0.0.1/8")
	e, d := publicEnv(t, up, mapResolver{"svc.test": {pub}, "named.test": {pub}, "gw.test": {mustAddr("11.22.40.1")},
		"mapped.test": {mustAddr("::ffff:11.22.33.44")}, "bcast.test": {mustAddr("11.22.33.255")}}, addrs,
		WithGateway(mustAddr("11.22.40.1")))
	e.register(2, "sb-a", "version: 1\nrules:\n  - {host: named.test, action: pass}\n  - {host: '*', action: pass}\n")
	c := e.client(2)
	if st, r := getStatus(t, c, "http://svc.test/before"); st != 200 {
		t.Fatalf("public address not a node address: %d %q", st, r)
	}
	addrs.set("127.0.0.1/8", "11.22.33.44/24") // the node gets the address after start
	for _, u := range []string{"http://svc.test/after", "http://11.22.33.44/literal", "http://[::ffff:11.22.33.44]/mapped",
		"http://mapped.test/mapped-dns"} {
		if st, r := getStatus(t, c, u); st != http.StatusForbidden || !strings.Contains(r, "an address of this node") {
			t.Errorf("%s: %d %q, want 403 naming this node", u, st, r)
		}
	}
	if st, r := getStatus(t, c, "http://bcast.test/b"); st != http.StatusForbidden || !strings.Contains(r, "broadcast address") {
		t.Errorf("directed broadcast: %d %q", st, r)
	}
	if st, r := getStatus(t, c, "http://gw.test/g"); st != http.StatusForbidden || !strings.Contains(r, "sandbox gateway") {
		t.Errorf("gateway: %d %q", st, r)
	}
	if st, r := getStatus(t, c, "http://named.test/named"); st != 200 {
		t.Errorf("a rule naming the host must allow it: %d %q", st, r)
	}
	if got := up.seen(); len(got) != 2 || got[0].Path != "/before" || got[1].Path != "/named" || d.count() != 2 {
		t.Fatalf("upstream saw %+v after %d dials", got, d.count())
	}
}

// TestHostServiceOnInterfaceAddress reaches a host service bound to 0.0.0.0 through every
// address of this machine's interfaces, as literals, mapped literals and names.
func TestHostServiceOnInterfaceAddress(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	port := l.Addr().(*net.TCPAddr).Port
	prefixes, err := interfacePrefixes()
	if err != nil {
		t.Fatal(err)
	}
	sys, _ := net.InterfaceAddrs()
	for _, a := range sys {
		ip, _ := netip.AddrFromSlice(a.(*net.IPNet).IP)
		if !slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Addr() == ip.Unmap() }) {
			t.Errorf("interface address %s not listed in %v", ip, prefixes)
		}
	}
	names := mapResolver{}
	var urls []string
	for i, pfx := range prefixes {
		a := pfx.Addr()
		name := fmt.Sprintf("host%d.test", i)
		names[name] = []netip.Addr{a}
		urls = append(urls, fmt.Sprintf("http://%s/", netip.AddrPortFrom(a, uint16(port))), fmt.Sprintf("http://%s:%d/", name, port))
		if a.Is4() {
			urls = append(urls, fmt.Sprintf("http://[::ffff:%s]:%d/", a, port))
		}
	}
	e := newEnv(t, WithResolver(names))
	e.register(2, "sb-a", "version: 1\ndefault: pass\nrules:\n  - {host: '*', action: pass}\n")
	c := e.client(2)
	for _, u := range urls {
		if st, r := getStatus(t, c, u); st != http.StatusForbidden {
			t.Errorf("%s: %d %q, want 403", u, st, r)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("host service answered %d requests", n)
	}
	// Whatever range they are in, the proxy knows them as the node's own.
	e2 := newEnv(t)
	for _, pfx := range prefixes {
		if r, err := e2.p.localReason(pfx.Addr().Unmap()); err != nil || r != "an address of this node" {
			t.Errorf("%s: %q %v", pfx.Addr(), r, err)
		}
	}
}

func TestConnectAndTransparentCheckTheDestination(t *testing.T) {
	up := newUpstream(t, false)
	addrs := &nodeAddrs{}
	addrs.set("11.22.33.44/24")
	dst := netip.MustParseAddrPort("11.22.33.44:80")
	e, d := publicEnv(t, up, mapResolver{"svc.test": {mustAddr("11.22.33.44")}}, addrs,
		WithOriginalDst(func(net.Conn) (netip.AddrPort, error) { return dst, nil }))
	e.register(2, "sb-a", "version: 1\ndefault: pass\n")

	c := dialFrom(t, 2, e.addr)
	_, _ = c.Write([]byte("CONNECT svc.test:80 HTTP/1.1\r\nHost: svc.test:80\r\n\r\n"))
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	_, _ = c.Write([]byte("GET /tunnel HTTP/1.1\r\nHost: svc.test:80\r\n\r\n"))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusForbidden)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.p.ServeTransparent(e.ctx, l) }()
	resp = roundTripRaw(t, dialFrom(t, 2, l.Addr().String()), "GET /transparent HTTP/1.1\r\nHost: svc.test\r\n\r\n")
	mustStatus(t, resp, http.StatusForbidden)
	if len(up.seen()) != 0 || d.count() != 0 {
		t.Fatalf("upstream saw %+v", up.seen())
	}
}

// switchResolver answers from the map currently stored (DNS that changes its answers).
type switchResolver struct{ m atomic.Pointer[mapResolver] }

func (s *switchResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return (*s.m.Load()).LookupNetIP(ctx, network, host)
}

func TestCommitAndCompensationRecheckTheDestination(t *testing.T) {
	up := newUpstream(t, false)
	addrs := &nodeAddrs{}
	addrs.set("127.0.0.1/8")
	res := &switchResolver{}
	public := mapResolver{"svc.test": {mustAddr("11.22.33.44")}, "refund.test": {mustAddr("11.22.33.45")}}
	res.m.Store(&public)
	e, d := publicEnv(t, up, res, addrs)
	e.register(2, "sb-a", `version: 1
rules:
  - host: '*'
    path_prefix: /charge
    action: compensate
    compensate: {method: POST, url: 'http://refund.test/refund'}
  - {host: '*', methods: [POST], action: hold}
`)
	c := e.client(2)
	id := holdPOST(t, c, "http://svc.test/order", "x")
	resp, err := c.Post("http://svc.test/charge/1", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, 200)
	if len(up.seen()) != 1 {
		t.Fatalf("upstream saw %+v", up.seen())
	}
	rebound := mapResolver{"svc.test": {mustAddr("127.0.0.1")}, "refund.test": {mustAddr("::ffff:10.0.0.1")}}
	res.m.Store(&rebound) // DNS now points at the node
	if _, _, err := e.p.Rollback(e.ctx, "sb-a", 1); err != nil {
		t.Fatal(err)
	}
	charge := e.p.Effects("sb-a")[1]
	if charge.Status != StatusFailed || !strings.Contains(charge.Error, "private") {
		t.Fatalf("compensation sent to a private address: %+v", charge)
	}
	_, _ = e.p.Commit(e.ctx, "sb-a")
	if eff, _ := e.p.Effect("sb-a", id); eff.Status != StatusFailed || !strings.Contains(eff.Error, "loopback") {
		t.Fatalf("held effect sent to loopback at commit: %+v", eff)
	}
	if len(up.seen()) != 1 || d.count() != 1 {
		t.Fatalf("upstream saw %+v after %d dials", up.seen(), d.count())
	}
}

func TestRedirectIsNotFollowed(t *testing.T) {
	var hostHits atomic.Int32
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hostHits.Add(1) }))
	t.Cleanup(host.Close)
	redir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, host.URL+"/internal", http.StatusFound)
	}))
	t.Cleanup(redir.Close)
	addrs := &nodeAddrs{}
	addrs.set("127.0.0.1/8")
	d := &redirectDialer{to: redir.Listener.Addr().String()}
	e := newEnv(t, WithResolver(mapResolver{"svc.test": {mustAddr("11.22.33.44")}}), WithDialer(d), WithNodeAddrs(addrs.list))
	e.register(2, "sb-a", "version: 1\ndefault: pass\n")
	c := e.client(2)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if st, _ := getStatus(t, c, "http://svc.test/go"); st != http.StatusFound {
		t.Fatalf("status %d, want the redirect itself", st)
	}
	if hostHits.Load() != 0 || d.count() != 1 {
		t.Fatalf("the proxy followed a redirect (%d dials)", d.count())
	}
}
