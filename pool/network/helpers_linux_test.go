package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// Test network: its own bridge, chains and a private subnet that only exists on that bridge.
// Ports are fixed (the firewall needs them before the gateway exists) and bound to the test
// gateway address only.
const (
	testNetwork   = "dbxtest"
	testBridge    = "dbxtest0"
	testProxyPort = 31280
	testHTTPPort  = 31281
	testHTTPSPort = 31282
	testOtherPort = 31283
)

var testSubnet = netip.MustParsePrefix("10.214.240.0/24")

// newRootManager returns a Manager on the test bridge; cleanup uninstalls everything.
func newRootManager(t testing.TB, subnet netip.Prefix) *Manager {
	t.Helper()
	testutil.RequiresRoot(t)
	for _, bin := range []string{"ip", "iptables", "iptables-restore", "ip6tables", "ip6tables-restore"} {
		testutil.RequiresBinary(t, bin)
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(DefaultCNIBinDir + "/" + p); err != nil {
			testutil.RequiresBinary(t, "cni-plugin-"+p+" (hack/install-deps.sh installs "+DefaultCNIBinDir+"/"+p+")")
		}
	}
	ctx := context.Background()
	nsDir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(nsDir, unix.MNT_DETACH) }) // New makes it a mount point
	m, err := New(ctx, Options{
		StateDir: t.TempDir(), NetworkName: testNetwork, Bridge: testBridge, Subnet: subnet,
		NetNSDir: nsDir, ProxyPort: testProxyPort,
		TransparentHTTPPort: testHTTPPort, TransparentHTTPSPort: testHTTPSPort,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Uninstall(context.Background()); err != nil {
			t.Errorf("Uninstall: %v", err)
		}
	})
	return m
}

// inNetNS runs fn on an OS thread that has joined the namespace at path. Sockets fn creates
// stay in that namespace; they may be used from any goroutine afterwards.
func inNetNS(t testing.TB, path string, fn func()) {
	t.Helper()
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		var fd int
		if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		defer unix.Close(fd)
		if err = unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return
		}
		fn()
	}()
	wg.Wait()
	if err != nil {
		t.Fatalf("enter netns %s: %v", path, err)
	}
}

// dialFrom connects from inside the namespace; it returns the connection or the error.
func dialFrom(t testing.TB, nsPath, network string, to netip.AddrPort) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	var err error
	inNetNS(t, nsPath, func() {
		c, err = net.DialTimeout(network, to.String(), 500*time.Millisecond)
	})
	return c, err
}

// listenIn opens a TCP listener inside the namespace.
func listenIn(t testing.TB, nsPath string, at string) net.Listener {
	t.Helper()
	var l net.Listener
	var err error
	inNetNS(t, nsPath, func() { l, err = net.Listen("tcp4", at) })
	if err != nil {
		t.Fatalf("listen in %s on %s: %v", nsPath, at, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// server is a host-side TCP listener that records who connected and where they were headed.
type server struct {
	l     net.Listener
	mu    sync.Mutex
	conns []accepted
}

type accepted struct {
	from, origDst netip.AddrPort
}

func serve(t testing.TB, at string) *server {
	t.Helper()
	l, err := net.Listen("tcp4", at)
	if err != nil {
		t.Fatalf("listen %s: %v", at, err)
	}
	s := &server{l: l}
	t.Cleanup(func() { l.Close() })
	go s.loop()
	return s
}

func (s *server) loop() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		tc := c.(*net.TCPConn)
		orig, _ := OriginalDst(tc)
		s.mu.Lock()
		s.conns = append(s.conns, accepted{from: tc.RemoteAddr().(*net.TCPAddr).AddrPort(), origDst: orig})
		s.mu.Unlock()
		fmt.Fprintf(c, "hello from %s\n", s.l.Addr())
		c.Close()
	}
}

func (s *server) seen() []accepted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]accepted(nil), s.conns...)
}

func (s *server) port() uint16 { return uint16(s.l.Addr().(*net.TCPAddr).Port) }
