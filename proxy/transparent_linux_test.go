//go:build linux

package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// netnsTest is a private network namespace with loopback up, removed after the test.
type netnsTest struct {
	t    *testing.T
	name string
}

func newNetns(t *testing.T) *netnsTest {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "ip")
	testutil.RequiresBinary(t, "iptables")
	n := &netnsTest{t: t, name: fmt.Sprintf("dbxproxy-test-%d", os.Getpid())}
	n.run("ip", "netns", "add", n.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.name).Run() })
	n.run("ip", "netns", "exec", n.name, "ip", "link", "set", "lo", "up")
	return n
}

func (n *netnsTest) run(args ...string) {
	n.t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		n.t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// do runs fn on an OS thread inside the namespace; the thread is discarded afterwards.
func (n *netnsTest) do(fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		fd, err := unix.Open("/var/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err == nil {
			fn()
		}
		errc <- err
	}()
	return <-errc
}

// nsDialer dials from inside the namespace (the proxy's upstream side in this test).
type nsDialer struct{ ns *netnsTest }

func (d nsDialer) DialContext(ctx context.Context, network, addr string) (c net.Conn, err error) {
	if nerr := d.ns.do(func() { c, err = (&net.Dialer{}).DialContext(ctx, network, addr) }); nerr != nil {
		return nil, nerr
	}
	return c, err
}

// TestTransparentRedirect sends a sandbox's plain HTTP through a real iptables REDIRECT: the
// proxy learns the destination from SO_ORIGINAL_DST.
func TestTransparentRedirect(t *testing.T) {
	ns := newNetns(t)
	var proxyL, upL net.Listener
	var err error
	if nerr := ns.do(func() {
		if proxyL, err = net.Listen("tcp", "127.0.0.1:0"); err == nil {
			upL, err = net.Listen("tcp", "127.0.0.1:0")
		}
	}); nerr != nil || err != nil {
		t.Fatal(nerr, err)
	}
	upHandler := &upstream{keys: map[string]int{}} // in the namespace, so not an httptest server
	srv := &http.Server{Handler: http.HandlerFunc(upHandler.serve)}
	go func() { _ = srv.Serve(upL) }()
	t.Cleanup(func() { srv.Close() })

	_, upPort, _ := net.SplitHostPort(upL.Addr().String())
	_, proxyPort, _ := net.SplitHostPort(proxyL.Addr().String())
	ns.run("ip", "netns", "exec", ns.name, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
		"-s", "127.0.0.2", "-d", "127.0.0.1", "--dport", upPort, "-j", "REDIRECT", "--to-ports", proxyPort)

	e := newEnv(t, WithDialer(nsDialer{ns}))
	e.register(2, "sb-a", basePolicy(upL.Addr().String()))
	go func() { _ = e.p.ServeTransparent(e.ctx, proxyL) }()

	for _, c := range []struct {
		method string
		want   int
	}{{"GET", 200}, {"POST", 202}} {
		var conn net.Conn
		if nerr := ns.do(func() {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
			conn, err = d.Dial("tcp", upL.Addr().String())
		}); nerr != nil || err != nil {
			t.Fatal(nerr, err)
		}
		resp := roundTripRaw(t, conn, c.method+" /redirected HTTP/1.1\r\nHost: "+upL.Addr().String()+"\r\nContent-Length: 0\r\n\r\n")
		body := mustStatus(t, resp, c.want)
		conn.Close()
		if c.method == "POST" && !strings.Contains(body, `"held":true`) {
			t.Fatalf("POST answer %q", body)
		}
	}
	if got := upHandler.seen(); len(got) != 1 || got[0].Method != "GET" {
		t.Fatalf("upstream saw %+v", got)
	}
	if n := len(e.p.Effects("sb-a", StatusHeld)); n != 1 {
		t.Fatalf("%d held effects", n)
	}
}
