package network

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/testutil"
)

func setup(t testing.TB, m *Manager, id string) Attachment {
	t.Helper()
	att, err := m.Setup(context.Background(), id)
	if err != nil {
		t.Fatalf("Setup(%s): %v", id, err)
	}
	return att
}

func ensureFirewall(t *testing.T, m *Manager) {
	if err := m.fw.ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func mustConnect(t *testing.T, from Attachment, to netip.AddrPort) {
	t.Helper()
	c, err := dialFrom(t, from.NetNSPath, "tcp4", to)
	if err != nil {
		t.Fatalf("%s -> %s: %v", from.ID, to, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "hello") {
		t.Fatalf("%s -> %s: read %q, %v", from.ID, to, line, err)
	}
}

func mustNotConnect(t *testing.T, from Attachment, to netip.AddrPort) {
	t.Helper()
	c, err := dialFrom(t, from.NetNSPath, "tcp4", to)
	if err == nil {
		c.Close()
		t.Fatalf("%s -> %s connected, want it dropped", from.ID, to)
	}
	t.Logf("%s -> %s: %v", from.ID, to, err)
}

// udpDropped sends datagrams from the sandbox to a host UDP socket on the gateway (and to
// port 53) and checks that nothing arrives.
func udpDropped(t *testing.T, a Attachment, gw netip.Addr) {
	pc, err := net.ListenPacket("udp4", netip.AddrPortFrom(gw, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	to := netip.MustParseAddrPort(pc.LocalAddr().String())
	for _, dst := range []netip.AddrPort{to, netip.AddrPortFrom(gw, 53)} {
		c, err := dialFrom(t, a.NetNSPath, "udp4", dst)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("ping"))
		c.Close()
	}
	_ = pc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, from, err := pc.ReadFrom(make([]byte, 64)); err == nil {
		t.Fatalf("UDP got %d bytes from %s", n, from)
	}
}

// hostAddrs returns the host's IPv4 addresses outside the test bridge.
func hostAddrs(t *testing.T) []netip.Addr {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, ifi := range ifs {
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err == nil && p.Addr().Is4() && ifi.Name != testBridge {
				out = append(out, p.Addr())
			}
		}
	}
	return out
}

func ipv6Addrs(t *testing.T) []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() {
			out = append(out, p.String())
		}
	}
	return out
}

func TestTeardownFreesEverything(t *testing.T) {
	// A /29 has five sandbox addresses: exhaust it, free one, and get it back.
	m := newRootManager(t, netip.MustParsePrefix("10.214.241.0/29"))
	ctx := context.Background()
	var atts []Attachment
	for i := range 5 {
		atts = append(atts, setup(t, m, "full-"+string(rune('a'+i))))
	}
	if _, err := m.Setup(ctx, "full-f"); err == nil {
		t.Fatal("Setup in a full subnet succeeded")
	}
	if _, err := os.Stat(m.NetNSPath("full-f")); !os.IsNotExist(err) {
		t.Fatalf("failed Setup left its netns: %v", err)
	}
	victim := atts[2]
	for range 2 { // idempotent
		if err := m.Teardown(ctx, victim.ID); err != nil {
			t.Fatalf("Teardown: %v", err)
		}
	}
	if _, err := os.Stat(victim.NetNSPath); !os.IsNotExist(err) {
		t.Fatalf("netns still there: %v", err)
	}
	if _, err := m.Lookup(ctx, victim.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("Lookup after Teardown: %v, want NotFound", err)
	}
	testutil.WaitFor(t, 5*time.Second, 10*time.Millisecond, "veth to leave the bridge", func() bool {
		return bridgePorts(t) == 4
	})
	again := setup(t, m, "full-f")
	if again.IP != victim.IP {
		t.Fatalf("new sandbox got %s, want the freed %s", again.IP, victim.IP)
	}
	// The survivors still reach the proxy (the bridge's MAC did not move under their ARP caches).
	proxy := serve(t, netip.AddrPortFrom(m.Gateway(), testProxyPort).String())
	for _, a := range []Attachment{atts[0], atts[4], again} {
		mustConnect(t, a, netip.AddrPortFrom(m.Gateway(), testProxyPort))
	}
	_ = proxy
}

func bridgePorts(t testing.TB) int { return len(bridgePortNames(t)) }

func bridgePortNames(t testing.TB) []string {
	entries, err := os.ReadDir(filepath.Join("/sys/class/net", testBridge, "brif"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// setIsolation turns the test bridge's port isolation on or off on every port.
func setIsolation(t testing.TB, state string) {
	for _, port := range bridgePortNames(t) {
		if _, err := (execRunner{}).Run(context.Background(), nil, "ip", "link", "set", "dev", port, "type", "bridge_slave", "isolated", state); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReconcileAndLookup(t *testing.T) {
	m := newRootManager(t, testSubnet)
	ctx := context.Background()
	keep, drop := setup(t, m, "keep-1"), setup(t, m, "drop-1")
	// A half-done sandbox: an IP reservation without a namespace.
	half := setup(t, m, "half-1")
	if err := removeNetNS(half.NetNSPath); err != nil {
		t.Fatal(err)
	}
	got, err := m.Lookup(ctx, keep.ID)
	if err != nil || got != keep {
		t.Fatalf("Lookup = %+v, %v; want %+v", got, err, keep)
	}
	removed, err := m.Reconcile(ctx, func(id string) bool { return id == keep.ID })
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if want := []string{drop.ID, half.ID}; !slices.Equal(removed, want) {
		t.Fatalf("Reconcile removed %v, want %v", removed, want)
	}
	ids, err := m.knownIDs()
	if err != nil || !slices.Equal(ids, []string{keep.ID}) {
		t.Fatalf("left %v, %v; want only %s", ids, err, keep.ID)
	}
}

func TestNewIsIdempotent(t *testing.T) {
	m := newRootManager(t, testSubnet)
	a := setup(t, m, "idem-1")
	m2, err := New(context.Background(), m.opts)
	if err != nil {
		t.Fatalf("second New: %v", err)
	}
	if out, err := m2.opts.Runner.Run(context.Background(), nil, "iptables", "-w", "-S", "INPUT"); err != nil || strings.Count(string(out), "-j DBXTEST-INPUT") != 1 {
		t.Fatalf("INPUT jumps after two New: %q, %v", out, err)
	}
	serve(t, netip.AddrPortFrom(m.Gateway(), testProxyPort).String())
	mustConnect(t, a, netip.AddrPortFrom(m.Gateway(), testProxyPort))
	if _, err := m2.Setup(context.Background(), "idem-1"); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Setup of an existing sandbox: %v, want AlreadyExists", err)
	}
}

func TestConcurrentSetupTeardown(t *testing.T) {
	m := newRootManager(t, testSubnet)
	ctx := context.Background()
	const n = 8
	atts := make([]Attachment, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			var err error
			atts[i], err = m.Setup(ctx, "par-"+string(rune('a'+i)))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, port := range bridgePortNames(t) {
		v, err := os.ReadFile(filepath.Join("/sys/class/net", port, "brport", "isolated"))
		if err != nil || strings.TrimSpace(string(v)) != "1" {
			t.Fatalf("bridge port %s isolated = %q, %v", port, v, err)
		}
	}
	seen := map[netip.Addr]bool{}
	for _, a := range atts {
		if seen[a.IP] || !testSubnet.Contains(a.IP) || a.IP == m.Gateway() {
			t.Fatalf("bad or duplicate IP %s in %v", a.IP, atts)
		}
		seen[a.IP] = true
	}
	for _, a := range atts {
		go func() { errs <- m.Teardown(ctx, a.ID) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if ids, err := m.knownIDs(); err != nil || len(ids) != 0 {
		t.Fatalf("left %v, %v", ids, err)
	}
}

// TestEnsureRepairs: a rule someone inserts above DeltaBox's jumps (or a flush) opens the host
// to sandboxes until Ensure puts the firewall back.
func TestEnsureRepairs(t *testing.T) {
	m := newRootManager(t, testSubnet)
	a := setup(t, m, "repair-1")
	serve(t, netip.AddrPortFrom(m.Gateway(), testOtherPort).String())
	other := netip.AddrPortFrom(m.Gateway(), testOtherPort)
	run := func(args ...string) {
		if _, err := (execRunner{}).Run(context.Background(), nil, "iptables", args...); err != nil {
			t.Fatal(err)
		}
	}
	foreign := []string{"INPUT", "-i", testBridge, "-p", "tcp", "-j", "ACCEPT"}
	run(append([]string{"-w", "-I"}, foreign...)...)
	defer run(append([]string{"-w", "-D"}, foreign...)...)
	mustConnect(t, a, other) // bypassed
	start := time.Now()
	if err := m.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("Ensure took %s", time.Since(start))
	mustNotConnect(t, a, other)
}
