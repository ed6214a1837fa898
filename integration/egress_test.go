package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// upstream is a local HTTP API that counts what reaches it.
type upstream struct {
	mu    sync.Mutex
	seen  map[string]int      // "METHOD /path" -> count
	keys  map[string][]string // "METHOD /path" -> Idempotency-Key values
	plain *httptest.Server
	tls   *httptest.Server
	ca    string // PEM file trusting tls
}

func startUpstream(t testing.TB) *upstream {
	u := &upstream{seen: map[string]int{}, keys: map[string][]string{}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Method + " " + r.URL.Path
		u.mu.Lock()
		u.seen[k]++
		u.keys[k] = append(u.keys[k], r.Header.Get("Idempotency-Key"))
		u.mu.Unlock()
		if r.Method == http.MethodGet {
			fmt.Fprint(w, "real body from upstream")
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"created": true}`)
	})
	u.plain = httptest.NewServer(h)
	u.tls = httptest.NewTLSServer(h)
	t.Cleanup(u.plain.Close)
	t.Cleanup(u.tls.Close)
	u.ca = filepath.Join(shortTempDir(t), "upstream-ca.pem")
	pemData := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.tls.Certificate().Raw})
	if err := os.WriteFile(u.ca, pemData, 0o644); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *upstream) count(k string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[k]
}

const egressPolicy = `version: 1
default: deny
rules:
  - host: 127.0.0.1
    methods: [GET, HEAD]
    action: pass
  - host: 127.0.0.1
    methods: [POST, PUT, PATCH, DELETE]
    action: hold
`

// egressDaemon starts a daemon trusting the upstream's CA, with a pool whose policy lets
// sandboxes reach the upstream on the host's loopback (reads pass, writes are held).
func egressDaemon(t *testing.T, u *upstream, image string, ready int, extraConfig string, poolArgs ...string) *daemon {
	d := startDaemonWith(t, fmt.Sprintf("[egress]\nupstream_ca_file = %q\n%s", u.ca, extraConfig))
	policy := filepath.Join(shortTempDir(t), "policy.yaml")
	os.WriteFile(policy, []byte(egressPolicy), 0o644)
	d.createPool("net", image, ready, append([]string{"--egress-policy", policy, "--max", "40"}, poolArgs...)...)
	return d
}

// noProxyBypass clears NO_PROXY so that even 127.0.0.1 goes through the proxy: the upstream
// lives on the host's loopback, not the sandbox's.
var noProxyBypass = []string{"--env", "NO_PROXY=", "--env", "no_proxy="}

func TestEgressHoldCommitRollback(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	if out := d.cli("exec", id, "--", "curl", "-sS", "-m", "10", u.plain.URL+"/data"); out != "real body from upstream" {
		t.Fatalf("curl http GET: %q", out)
	}
	if out := d.cli("exec", id, "--", "curl", "-sS", "-m", "10", u.tls.URL+"/data"); out != "real body from upstream" {
		t.Fatalf("curl https GET (intercepted, upstream verified): %q", out)
	}
	py := fmt.Sprintf(`import urllib.request as u; print(u.urlopen(%q, timeout=10).read().decode())`, u.tls.URL+"/data")
	if out := d.cli("exec", id, "--", "python3", "-c", py); out != "real body from upstream\n" {
		t.Fatalf("python urllib https GET: %q", out)
	}
	out := d.cli("exec", id, "--", "curl", "-sS", "-m", "10", "-i", "-X", "POST", "-d", "a=1", u.plain.URL+"/items")
	if !strings.Contains(out, "202") || !strings.Contains(out, `"held":true`) || !strings.Contains(out, "X-Deltabox-Effect-Id") {
		t.Fatalf("held POST answer: %q", out)
	}
	d.cli("checkpoint", "create", id)
	post := fmt.Sprintf(`import urllib.request as u; r = u.urlopen(u.Request(%q, data=b"b=2", method="POST"), timeout=10); print(r.status)`, u.tls.URL+"/items")
	if out := d.cli("exec", id, "--", "python3", "-c", post); out != "202\n" {
		t.Fatalf("python held POST: %q", out)
	}
	var rb api.RollbackResult
	d.cliJSON(&rb, "rollback", id)
	if rb.EffectsDropped != 1 || u.count("POST /items") != 0 {
		t.Fatalf("rollback dropped %d effects; upstream saw %d POSTs before commit", rb.EffectsDropped, u.count("POST /items"))
	}
	var cm api.CommitResult
	d.cliJSON(&cm, "commit", id)
	if cm.EffectsReleased != 1 || u.count("POST /items") != 1 || u.keys["POST /items"][0] == "" {
		t.Fatalf("commit: %+v; upstream saw %d POSTs, keys %v", cm, u.count("POST /items"), u.keys["POST /items"])
	}
	d.cli("commit", id) // a second commit sends nothing again
	var effects []api.Effect
	d.cliJSON(&effects, "effects", "ls", id)
	statuses := map[string]int{}
	for _, e := range effects {
		statuses[e.Status]++
	}
	if statuses["released"] != 1 || statuses["dropped"] != 1 || u.count("POST /items") != 1 {
		t.Fatalf("effects after commit: %v (upstream POSTs %d)", statuses, u.count("POST /items"))
	}
	// effects show prints what the sandbox sent: headers (credentials redacted) and body.
	d.cli("exec", id, "--", "curl", "-sS", "-m", "10", "-X", "POST", "-H", "Authorization: Bearer s3cret",
		"-H", "X-Trace: t-1", "-d", "shown=body", u.plain.URL+"/shown")
	d.cliJSON(&effects, "effects", "ls", id, "--status", "held")
	if len(effects) != 1 {
		t.Fatalf("held effects: %+v", effects)
	}
	shown := d.cli("effects", "show", id, effects[0].ID)
	mustContain(t, "effects show", shown, "POST "+u.plain.URL+"/shown", "X-Trace: t-1", "Authorization: [redacted]", "shown=body")
	if strings.Contains(shown, "s3cret") {
		t.Fatalf("effects show printed a credential:\n%s", shown)
	}
}

func TestEgressBusyboxWget(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, busyboxImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	if out := d.cli("exec", id, "--", "wget", "-q", "-O", "-", u.plain.URL+"/data"); out != "real body from upstream" {
		t.Fatalf("busybox wget: %q", out)
	}
	if u.count("GET /data") != 1 {
		t.Fatalf("upstream saw %d GETs, want 1", u.count("GET /data"))
	}
	// The released sandbox comes back (same address) for the next lease: the proxy must know
	// it under the new lease.
	d.cli("release", id)
	d.waitReady("net", 1, 30*time.Second)
	next := d.lease("net", noProxyBypass...).ID
	if out := d.cli("exec", next, "--", "wget", "-q", "-O", "-", u.plain.URL+"/data"); out != "real body from upstream" {
		t.Fatalf("busybox wget after re-lease: %q", out)
	}
}

func TestEgressNothingGoesAround(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 2, "")
	a, b := d.lease("net"), d.lease("net")
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	gw := strings.TrimSuffix(d.net.subnet.Addr().String(), ".0") + ".1"
	d.cli("exec", b.ID, "--", "sh", "-c", "nohup python3 -m http.server 8080 >/dev/null 2>&1 &")
	probe := `import socket, sys
def tcp(host, port):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); return "open"
    except Exception as e:
        return "closed"
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    try:
        s.sendto(b"ping", (host, port)); s.recvfrom(100); return "answered"
    except Exception:
        return "silent"
print(tcp(sys.argv[1], int(sys.argv[2])), tcp(sys.argv[3], 8080), tcp("169.254.169.254", 80), udp(sys.argv[1], 53), tcp(sys.argv[1], 3128))`
	out := d.cli("exec", a.ID, "--", "python3", "-c", probe, gw, fmt.Sprint(port), b.IP)
	if out != "closed closed closed silent open\n" {
		t.Fatalf("from a sandbox, host port / other sandbox / metadata / UDP / proxy = %q, want closed closed closed silent open", out)
	}
}

func TestEgressJournalsStaySeparate(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 10, "")
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = d.lease("net", noProxyBypass...).ID
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := fmt.Sprintf(`for i in 1 2 3 4 5 6 7 8 9 10; do curl -sS -m 20 -o /dev/null -d x=$i "%s/items?sb=%s&n=$i" & done; wait`, u.plain.URL, id)
			d.cliRaw("exec", id, "--", "sh", "-c", script)
		}()
	}
	wg.Wait()
	for _, id := range ids {
		var effects []api.Effect
		d.cliJSON(&effects, "effects", "ls", id, "--status", "held")
		if len(effects) != 10 {
			t.Errorf("sandbox %s holds %d effects, want 10", id, len(effects))
		}
		for _, e := range effects {
			if !strings.Contains(e.URL, "sb="+id) {
				t.Errorf("sandbox %s journal holds another sandbox's effect: %s", id, e.URL)
			}
		}
	}
	if u.count("POST /items") != 0 {
		t.Errorf("held effects reached the upstream: %d", u.count("POST /items"))
	}
}

func TestEgressBadInput(t *testing.T) {
	u := startUpstream(t)
	bad := startUntrustedTLS(t)
	d := egressDaemon(t, u, pythonImage, 1, "body_limit = 1024\n")
	id := d.lease("net", noProxyBypass...).ID
	status := func(args ...string) string {
		out, _, _ := d.cliRaw(append([]string{"exec", id, "--", "curl", "-sS", "-m", "10", "-o", "/dev/null", "-D", "-"}, args...)...)
		return out
	}
	big := status("-X", "POST", "--data-binary", strings.Repeat("x", 4096), u.plain.URL+"/items")
	if !strings.Contains(big, " 413") || u.count("POST /items") != 0 {
		t.Errorf("body over the limit: %q", big)
	}
	var effects []api.Effect
	d.cliJSON(&effects, "effects", "ls", id)
	if len(effects) != 0 {
		t.Errorf("an oversized body was journaled: %+v", effects)
	}
	denied := status("http://example.invalid/")
	if !strings.Contains(denied, " 403") || !strings.Contains(strings.ToLower(denied), "x-deltabox-reason") {
		t.Errorf("denied host: %q", denied)
	}
	tlsFail := status(bad + "/data")
	if !strings.Contains(tlsFail, " 502") || !strings.Contains(strings.ToLower(tlsFail), "x-deltabox-reason") {
		t.Errorf("upstream TLS failure: %q", tlsFail)
	}
	// A malformed request, and a Host header inside a CONNECT tunnel that disagrees with the
	// CONNECT authority.
	raw := `import os, socket, ssl, sys
host, port = os.environ["HTTP_PROXY"][7:].split(":")
def conn():
    return socket.create_connection((host, int(port)), timeout=5)
def status(s):
    return s.recv(200).split(b"\r\n")[0].decode()
s = conn(); s.sendall(b"GARBAGE\r\n\r\n"); print(status(s))
s = conn(); s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (sys.argv[1], sys.argv[1])).encode()); print(status(s))
s.recv(1000) if False else None
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]); ctx.check_hostname = False
t = ctx.wrap_socket(s, server_hostname=sys.argv[1].split(":")[0])
t.sendall(b"GET /data HTTP/1.1\r\nHost: other.example\r\n\r\n"); print(status(t))`
	out := d.cli("exec", id, "--", "python3", "-c", raw, strings.TrimPrefix(u.tls.URL, "https://"))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "400") || !strings.Contains(lines[1], "200") || !strings.Contains(lines[2], "421") {
		t.Errorf("malformed request / CONNECT then a disagreeing Host: %q", out)
	}
}

// startUntrustedTLS serves HTTPS with a self-signed certificate nobody trusts.
func startUntrustedTLS(t *testing.T) string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "untrusted"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "should not be seen") }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

// flakyUpstream answers 503 (or hangs) until told to work, recording every Idempotency-Key.
type flakyUpstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	mode string // "5xx", "hang" or "ok"
	keys []string
	hang chan struct{}
}

func startFlakyUpstream(t *testing.T, mode string) *flakyUpstream {
	f := &flakyUpstream{mode: mode, hang: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		mode := f.mode
		f.mu.Unlock()
		switch mode {
		case "5xx":
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		case "hang":
			select {
			case <-f.hang:
			case <-r.Context().Done():
			}
		default:
			fmt.Fprint(w, "ok")
		}
	}))
	t.Cleanup(func() { close(f.hang); f.srv.Close() })
	return f
}

func (f *flakyUpstream) set(mode string) {
	f.mu.Lock()
	f.mode = mode
	f.mu.Unlock()
}

// keysAre checks that the upstream got n attempts, each with want as its key.
func (f *flakyUpstream) keysAre(t *testing.T, want string, n int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.keys) != n {
		t.Fatalf("upstream got %d attempts, want %d (keys %v)", len(f.keys), n, f.keys)
	}
	for _, k := range f.keys {
		if k != want {
			t.Fatalf("Idempotency-Key %q, want %q on every attempt", k, want)
		}
	}
}

func (d *daemon) effectByURL(id, url string) api.Effect {
	d.t.Helper()
	var effects []api.Effect
	d.cliJSON(&effects, "effects", "ls", id)
	for _, e := range effects {
		if e.URL == url {
			return e
		}
	}
	d.t.Fatalf("no effect for %s in %+v", url, effects)
	return api.Effect{}
}

// TestEgressFailedEffectsAreTheUsersToDecide: bounded attempts by config, commit exits
// non-zero naming the failed effect, every attempt recorded with one key, retry and abandon.
func TestEgressFailedEffectsAreTheUsersToDecide(t *testing.T) {
	u := startUpstream(t)
	flaky := startFlakyUpstream(t, "5xx")
	hung := startFlakyUpstream(t, "hang")
	d := egressDaemon(t, u, pythonImage, 1, "commit_attempts = 2\ncommit_timeout = \"500ms\"\ncommit_backoff = \"10ms\"\n")
	id := d.lease("net", noProxyBypass...).ID
	url := flaky.srv.URL + "/charge"
	d.holdPost(id, url)
	d.cli("checkpoint", "create", id)
	eff := d.effectByURL(id, url)
	_, errOut, code := d.cliRaw("commit", id)
	if code == 0 || !strings.Contains(errOut, eff.ID) || !strings.Contains(errOut, "upstream answered 503") {
		t.Fatalf("commit with a failing upstream: exit %d, stderr %q", code, errOut)
	}
	eff = d.effectByURL(id, url)
	if eff.Status != "failed" || eff.Attempts != 2 || len(eff.History) != 2 || eff.History[1].Status != 503 || eff.Error == "" {
		t.Fatalf("failed effect %+v", eff)
	}
	flaky.keysAre(t, "deltabox-"+eff.ID, 2)
	if out := d.cli("effects", "ls", id); !strings.Contains(out, "upstream answered 503") || !strings.Contains(out, "ATTEMPTS") {
		t.Fatalf("effects ls does not show progress:\n%s", out)
	}
	flaky.set("ok")
	var rr api.RetryEffectsResult
	d.cliJSON(&rr, "effects", "retry", id, eff.ID)
	if rr.EffectsReleased != 1 || d.effectByURL(id, url).Status != "released" {
		t.Fatalf("retry: %+v", rr)
	}
	flaky.keysAre(t, "deltabox-"+eff.ID, 3)

	// A black-holed upstream costs attempts x timeout, then the effect is abandoned.
	hurl := hung.srv.URL + "/never"
	d.holdPost(id, hurl)
	d.cli("checkpoint", "create", id)
	start := time.Now()
	if _, errOut, code := d.cliRaw("commit", id); code == 0 || !strings.Contains(errOut, "no answer within 500ms") {
		t.Fatalf("commit with a hung upstream: exit %d, stderr %q", code, errOut)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("commit with a hung upstream took %s", took)
	}
	heff := d.effectByURL(id, hurl)
	hung.keysAre(t, "deltabox-"+heff.ID, 2)
	var ab api.Effect
	d.cliJSON(&ab, "effects", "abandon", id, heff.ID)
	if ab.Status != "abandoned" {
		t.Fatalf("abandon: %+v", ab)
	}
	d.cli("commit", id) // nothing failed in it: exit 0
	if _, _, code := d.cliRaw("effects", "retry", id, heff.ID); code == 0 {
		t.Fatal("retry of an abandoned effect succeeded")
	}
	hung.keysAre(t, "deltabox-"+heff.ID, 2)
}
