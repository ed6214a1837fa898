package network

import (
	"context"
	"net/netip"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// isolation is TestIsolation's fixture: sandboxes A and B, and listeners where a sandbox must
// and must not get to.
type isolation struct {
	m                    *Manager
	a, b                 Attachment
	gw                   netip.Addr
	proxy, httpT, httpsT *server // the allowed gateway ports
	other, loop, anyAddr *server // gateway:other, 127.0.0.1:*, 0.0.0.0:*
	inB                  netip.AddrPort
}

func newIsolation(t *testing.T) *isolation {
	m := newRootManager(t, testSubnet)
	x := &isolation{m: m, a: setup(t, m, "sbx-a"), b: setup(t, m, "sbx-b"), gw: m.Gateway()}
	t.Logf("gateway %s, A %s (%s), B %s", x.gw, x.a.IP, x.a.NetNSPath, x.b.IP)
	x.proxy = serve(t, netip.AddrPortFrom(x.gw, testProxyPort).String())
	x.httpT = serve(t, netip.AddrPortFrom(x.gw, testHTTPPort).String())
	x.httpsT = serve(t, netip.AddrPortFrom(x.gw, testHTTPSPort).String())
	x.other = serve(t, netip.AddrPortFrom(x.gw, testOtherPort).String())
	x.loop = serve(t, "127.0.0.1:0")
	x.anyAddr = serve(t, "0.0.0.0:0")
	x.inB = netip.MustParseAddrPort(listenIn(t, x.b.NetNSPath, x.b.IP.String()+":8080").Addr().String())
	return x
}

// TestIsolation is the firewall's contract: a sandbox reaches the proxy ports on the gateway
// and nothing else; plain TCP to :80/:443 anywhere lands on the transparent ports.
func TestIsolation(t *testing.T) {
	x := newIsolation(t)
	t.Run("proxy port is reachable and sees the sandbox's IP", x.proxyReachable)
	t.Run("other gateway ports are dropped", x.otherPortsDropped)
	t.Run("host addresses other than the gateway are dropped", x.hostAddrsDropped)
	t.Run("other sandbox is unreachable", func(t *testing.T) { mustNotConnect(t, x.a, x.inB) })
	t.Run("other sandbox on :80 is dropped (same subnet: layer 2, never via the gateway)", func(t *testing.T) {
		mustNotConnect(t, x.a, netip.AddrPortFrom(x.b.IP, 80))
	})
	t.Run("link-local metadata is dropped, not redirected", x.metadataDropped)
	t.Run("plain TCP to :80 and :443 elsewhere lands on the transparent ports", x.redirected)
	t.Run("UDP gets nothing", func(t *testing.T) { udpDropped(t, x.a, x.gw) })
	t.Run("sandbox has no IPv6", func(t *testing.T) {
		inNetNS(t, x.a.NetNSPath, func() {
			if v6 := ipv6Addrs(t); len(v6) > 0 {
				t.Errorf("sandbox has IPv6 addresses %v", v6)
			}
		})
	})
	t.Run("without port isolation the firewall still drops sandbox-to-sandbox", x.bridgeFirewall)
	t.Run("control: without the firewall the drops above would connect", x.control)
}

func (x *isolation) proxyReachable(t *testing.T) {
	mustConnect(t, x.a, netip.AddrPortFrom(x.gw, testProxyPort))
	if got := x.proxy.seen(); len(got) != 1 || got[0].from.Addr() != x.a.IP {
		t.Fatalf("proxy saw %v, want one connection from %s", got, x.a.IP)
	}
}

func (x *isolation) otherPortsDropped(t *testing.T) {
	mustNotConnect(t, x.a, netip.AddrPortFrom(x.gw, testOtherPort))
	mustNotConnect(t, x.a, netip.AddrPortFrom(x.gw, x.anyAddr.port())) // host listener on 0.0.0.0
	if len(x.other.seen())+len(x.anyAddr.seen()) != 0 {
		t.Fatal("a host listener saw a sandbox connection")
	}
}

func (x *isolation) hostAddrsDropped(t *testing.T) {
	for _, h := range hostAddrs(t) {
		mustNotConnect(t, x.a, netip.AddrPortFrom(h, x.anyAddr.port()))
	}
	// 127.0.0.1 inside the sandbox is the sandbox's own loopback, not the host's.
	c, err := dialFrom(t, x.a.NetNSPath, "tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), x.loop.port()))
	if err == nil {
		c.Close()
		t.Fatal("sandbox reached the host's 127.0.0.1 listener")
	}
	if len(x.loop.seen())+len(x.anyAddr.seen()) != 0 {
		t.Fatal("a host listener saw a sandbox connection")
	}
}

func (x *isolation) metadataDropped(t *testing.T) {
	mustNotConnect(t, x.a, netip.MustParseAddrPort("169.254.169.254:80"))
	for _, c := range x.httpT.seen() {
		if c.origDst.Addr() == netip.MustParseAddr("169.254.169.254") {
			t.Fatalf("metadata connection landed on the transparent port: %v", c)
		}
	}
}

func (x *isolation) redirected(t *testing.T) {
	for _, tc := range []struct {
		dst string
		srv *server
	}{{"198.51.100.7:80", x.httpT}, {"198.51.100.7:443", x.httpsT}, {x.gw.String() + ":80", x.httpT}} {
		dst := netip.MustParseAddrPort(tc.dst)
		mustConnect(t, x.a, dst)
		got := tc.srv.seen()
		if len(got) == 0 || got[len(got)-1].origDst != dst || got[len(got)-1].from.Addr() != x.a.IP {
			t.Fatalf("transparent port %d saw %v, want the last from %s with SO_ORIGINAL_DST %s", tc.srv.port(), got, x.a.IP, dst)
		}
		t.Logf("%s -> %s, SO_ORIGINAL_DST %s", dst, tc.srv.l.Addr(), got[len(got)-1].origDst)
	}
}

// bridgeFirewall turns port isolation off: br_netfilter still sends bridged frames through
// the FORWARD jump, which drops them; without that jump as well, A does reach B (control).
func (x *isolation) bridgeFirewall(t *testing.T) {
	// With br_netfilter off, port isolation is the only layer-2 guard and there is no second
	// layer to test (modprobe br_netfilter).
	testutil.RequiresSysctl(t, "net.bridge.bridge-nf-call-iptables", "1")
	setIsolation(t, "off")
	defer setIsolation(t, "on")
	mustNotConnect(t, x.a, x.inB)
	for _, j := range x.m.fw.jumps() {
		if j.hook == "FORWARD" && j.to.tool == "iptables" {
			if err := x.m.fw.removeJump(context.Background(), j); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer ensureFirewall(t, x.m)
	c, err := dialFrom(t, x.a.NetNSPath, "tcp4", x.inB)
	if err != nil {
		t.Fatalf("control: no isolation and no firewall, yet A cannot reach B: %v", err)
	}
	c.Close()
}

// control shows the drops are the firewall's doing: without it, the same dials connect.
func (x *isolation) control(t *testing.T) {
	if err := x.m.fw.remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer ensureFirewall(t, x.m)
	mustConnect(t, x.a, netip.AddrPortFrom(x.gw, testOtherPort))
	mustConnect(t, x.a, netip.AddrPortFrom(x.gw, x.anyAddr.port()))
}
