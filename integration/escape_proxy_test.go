package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// permissivePolicy lets a sandbox reach any host by name or wildcard: what stays refused is
// refused by the proxy's own address checks, not by the policy.
const permissivePolicy = "version: 1\ndefault: pass\nrules:\n  - {host: '*', action: pass}\n"

// hostService is a service of the host bound to 0.0.0.0 that counts its visitors.
func hostService(t *testing.T) (port int, hits *atomic.Int32) {
	hits = &atomic.Int32{}
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "host secret")
	}))
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return l.Addr().(*net.TCPAddr).Port, hits
}

// hostAddrs returns this host's interface addresses other than loopback.
func hostAddrs(t *testing.T) []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.(*net.IPNet).IP)
		if ip = ip.Unmap(); !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			out = append(out, ip)
		}
	}
	return out
}

func permissiveDaemon(t *testing.T, extraEgress string) (*daemon, string) {
	d := startDaemonWith(t, "[egress]\n"+extraEgress)
	policy := filepath.Join(shortTempDir(t), "policy.yaml")
	if err := os.WriteFile(policy, []byte(permissivePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	d.createPool("open", pythonImage, 1, "--egress-policy", policy)
	return d, d.lease("open", noProxyBypass...).ID
}

// TestEscapeProxyToHost: a sandbox whose policy passes everything asks the proxy for a host
// service bound to 0.0.0.0 through every form of a host address; the proxy refuses each, and
// the service sees no one.
func TestEscapeProxyToHost(t *testing.T) {
	port, hits := hostService(t)
	d, id := permissiveDaemon(t, "")
	proxyURL := strings.TrimSpace(d.cli("exec", id, "--", "sh", "-c", "echo $HTTP_PROXY"))
	pu, err := url.Parse(proxyURL)
	if err != nil || pu.Hostname() == "" {
		t.Fatalf("sandbox HTTP_PROXY %q: %v", proxyURL, err)
	}
	gateway := pu.Hostname()
	type try struct{ url, want string }
	tries := []try{
		{fmt.Sprintf("http://%s:%d/", gateway, port), "403"},          // the sandbox gateway (the host)
		{fmt.Sprintf("http://127.0.0.1:%d/", port), "403"},            // loopback
		{fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/", port), "403"},   // IPv4-mapped loopback
		{fmt.Sprintf("http://[::ffff:%s]:%d/", gateway, port), "403"}, // IPv4-mapped gateway
		{fmt.Sprintf("http://[64:ff9b::7f00:1]:%d/", port), "403"},    // NAT64 of loopback
		{fmt.Sprintf("http://[::127.0.0.1]:%d/", port), "403"},        // IPv4-compatible loopback
		{fmt.Sprintf("http://0.0.0.0:%d/", port), "403"},              // this host
		{fmt.Sprintf("http://localhost:%d/", port), "403"},            // a name resolving to loopback
		{fmt.Sprintf("http://2130706433:%d/", port), "403"},           // decimal 127.0.0.1 (curl reads it as the address)
		{fmt.Sprintf("http://0x7f.1:%d/", port), "403"},               // hex and short form
		{fmt.Sprintf("http://0177.0.0.1:%d/", port), "403"},           // octal
		{fmt.Sprintf("https://127.0.0.1:%d/", port), "403"},           // CONNECT, then the inner request
		{fmt.Sprintf("http://[2002:7f00:1::]:%d/", port), "403"},      // 6to4 of loopback
		{fmt.Sprintf("http://%s:%d/", hostnameOf(t), port), "403"},    // the host's own name
		{fmt.Sprintf("http://169.254.169.254:%d/", port), "403"},      // metadata
		{fmt.Sprintf("http://[fe80::1]:%d/", port), "403"},            // link-local
		{fmt.Sprintf("http://255.255.255.255:%d/", port), "403"},      // broadcast
		{fmt.Sprintf("http://[::ffff:0:7f00:1]:%d/", port), "403"},    // IPv4-translated
		{fmt.Sprintf("http://[::]:%d/", port), "403"},                 // unspecified
		{fmt.Sprintf("http://[::1]:%d/", port), "403"},                // IPv6 loopback
		{fmt.Sprintf("http://100.64.0.1:%d/", port), "403"},           // shared address space
		{fmt.Sprintf("http://198.18.0.1:%d/", port), "403"},           // benchmarking
		{fmt.Sprintf("http://[fd00::1]:%d/", port), "403"},            // unique local
		{fmt.Sprintf("http://[2001:db8::1]:%d/", port), "403"},        // documentation
		{fmt.Sprintf("http://240.0.0.1:%d/", port), "403"},            // reserved
		{fmt.Sprintf("http://224.0.0.1:%d/", port), "403"},            // multicast
	}
	for _, a := range hostAddrs(t) { // the host's interface addresses (192.0.2.2 here)
		tries = append(tries, try{fmt.Sprintf("http://%s/", netip.AddrPortFrom(a, uint16(port))), "403"})
		if a.Is4() {
			tries = append(tries, try{fmt.Sprintf("http://[::ffff:%s]:%d/", a, port), "403"})
		}
	}
	for _, tr := range tries {
		out, _, _ := d.cliRaw("exec", id, "--", "curl", "-sS", "-k", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", tr.url)
		if got := strings.TrimSpace(out); got != tr.want {
			t.Errorf("%s: HTTP %q through the proxy, want %s", tr.url, got, tr.want)
		}
	}
	// curl reads numeric forms as addresses itself; sent as they are, the proxy refuses them.
	for _, host := range []string{"2130706433", "0x7f.1", "0177.0.0.1", "0x7f000001", "3221225986", "127.1"} {
		if got := rawProxyGet(t, d, id, fmt.Sprintf("%s:%d", host, port)); got != "400" {
			t.Errorf("raw request for %s: HTTP %s, want 400", host, got)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the host service answered %d requests from the sandbox", n)
	}
	d.cli("info") // the daemon is alive
}

// rawProxyGet sends the sandbox's proxy an absolute-form GET for hostport exactly as written
// and returns the status code of the answer.
func rawProxyGet(t *testing.T, d *daemon, id, hostport string) string {
	py := fmt.Sprintf(`
import os, socket, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTP_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=10)
s.sendall(b"GET http://%[1]s/ HTTP/1.1\r\nHost: %[1]s\r\nConnection: close\r\n\r\n")
print(s.recv(64).split()[1].decode())
`, hostport)
	return strings.TrimSpace(d.cli("exec", id, "--", "python3", "-c", py))
}

func hostnameOf(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestEscapeProxyConnectionFlood: a sandbox opening far more idle connections than
// max_connections gets the rest refused at once, and its slots come back when it closes them.
func TestEscapeProxyConnectionFlood(t *testing.T) {
	d, id := permissiveDaemon(t, "max_connections = 20\n")
	flood := `
import os, socket, time, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTP_PROXY"])
socks = [socket.create_connection((p.hostname, p.port), timeout=5) for _ in range(300)]
time.sleep(1)
refused = 0
for s in socks:
    s.settimeout(0.05)
    try:
        if s.recv(64).startswith(b"HTTP/1.1 429"):
            refused += 1
    except socket.timeout:
        pass
print(refused)
`
	if out := strings.TrimSpace(d.cli("exec", id, "--", "python3", "-c", flood)); out != "280" {
		t.Fatalf("%s of 300 connections refused, want 280 (max_connections = 20)", out)
	}
	port, _ := hostService(t)
	loop := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if out := d.cli("exec", id, "--", "curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", loop); strings.TrimSpace(out) != "403" {
		t.Fatalf("after the flood: HTTP %s, want the proxy's own 403 (its slots released)", out)
	}
	d.cli("info")
}
