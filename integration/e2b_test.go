package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// e2bGateway is a daemon serving the E2B-compatible API with two tenants' keys.
type e2bGateway struct {
	*daemon
	url      string // E2B_API_URL and E2B_SANDBOX_URL
	key      string
	otherKey string
}

// startE2BDaemon starts a daemon with [e2b] on a free loopback port and a warm busybox pool
// named pool.
func startE2BDaemon(t testing.TB, pool string, minReady int) *e2bGateway {
	t.Helper()
	dir := t.TempDir()
	g := &e2bGateway{key: "e2b_test_key_tenant_one_0123456789", otherKey: "e2b_test_key_tenant_two_9876543210"}
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("# test tenants\n"+g.key+"\n"+g.otherKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	g.url = "http://" + addr
	g.daemon = startDaemonWith(t, fmt.Sprintf("[e2b]\naddress = %q\napi_keys_file = %q\n", addr, keys))
	g.createPool(pool, busyboxImage, minReady)
	return g
}

func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// env is the environment that points the e2b SDK at the gateway.
func (g *e2bGateway) env() []string {
	return []string{"E2B_API_URL=" + g.url, "E2B_SANDBOX_URL=" + g.url, "E2B_API_KEY=" + g.key}
}

// TestE2BSDK runs the real e2b JS SDK's test suite (integration/e2b/sdk.test.cjs, node --test)
// against a daemon's E2B-compatible API: create, commands (foreground, background, stdin,
// kill, SIGTERM, pids as the sandbox sees them), terminals (pty: tty, resize, input, Ctrl-D,
// kill, exit code), files (write, read, list, rename, remove, watch), kill, timeout, list, pause/resume,
// DeltaBox checkpoints and rollback from E2B code, and the refusals (wrong key, unknown
// template, another tenant's sandbox).
func TestE2BSDK(t *testing.T) {
	node := testutil.RequiresBinary(t, "node")
	nodePath := testutil.RequiresEnv(t, "DELTABOX_E2B_NODE_PATH")
	suite, err := filepath.Abs("e2b/sdk.test.cjs")
	if err != nil {
		t.Fatal(err)
	}
	g := startE2BDaemon(t, "e2b", 2)
	// Forks and snapshots (L3) get a pool of their own.
	g.createPool("e2b-fork", busyboxImage, 1)

	t.Run("wrong key is refused before any sandbox is touched", func(t *testing.T) {
		before, err := g.client().Pool(context.Background(), "e2b")
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"", "e2b_wrong_key_0000000000000000"} {
			req, _ := http.NewRequest("POST", g.url+"/v2/sandboxes", strings.NewReader(`{"templateID":"e2b"}`))
			if key != "" {
				req.Header.Set("X-API-KEY", key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("create with key %q: status %d, want 401", key, resp.StatusCode)
			}
		}
		after, err := g.client().Pool(context.Background(), "e2b")
		if err != nil {
			t.Fatal(err)
		}
		if after.Leased != before.Leased || after.Leased != 0 {
			t.Errorf("leased sandboxes went from %d to %d after refused creates", before.Leased, after.Leased)
		}
	})

	args := []string{"--test", "--test-reporter=spec"}
	// DELTABOX_E2B_TEST_PATTERN runs only the tests whose names match it (a regular
	// expression, node --test-name-pattern), e.g. "pty|signal" while working on those.
	if pat := os.Getenv("DELTABOX_E2B_TEST_PATTERN"); pat != "" {
		args = append(args, "--test-name-pattern="+pat)
	}
	cmd := exec.Command(node, append(args, suite)...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), append(g.env(), "NODE_PATH="+nodePath, "DELTABOX_E2B_TEMPLATE=e2b", "DELTABOX_E2B_FORK_TEMPLATE=e2b-fork",
		"DELTABOX_E2B_OTHER_KEY="+g.otherKey)...)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test %s:\n%s", suite, out)
	if err != nil {
		t.Fatalf("the e2b SDK suite failed: %v\ndaemon log tail:\n%s", err, g.logTail())
	}
	if os.Getenv("DELTABOX_E2B_TEST_PATTERN") == "" && strings.Contains(string(out), "# skipped") && !strings.Contains(string(out), "# skipped 0") {
		t.Errorf("the e2b SDK suite skipped tests")
	}
}

// e2bCall makes one request to the gateway and decodes a JSON answer into out (if not nil).
func (g *e2bGateway) e2bCall(t *testing.T, method, path, body string, out any, hdr ...string) int {
	t.Helper()
	req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decode: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

// TestE2BRestart: a port of a sandbox is reachable through the gateway with the sandbox's
// token only; a sandbox created through the E2B API survives a daemon restart with its owner,
// access token and files; another tenant still cannot reach it.
func TestE2BRestart(t *testing.T) {
	g := startE2BDaemon(t, "e2b", 1)
	var c struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if st := g.e2bCall(t, "POST", "/v2/sandboxes", `{"templateID":"e2b","metadata":{"k":"v"}}`, &c, "X-API-KEY", g.key); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	envd := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	if st := g.e2bCall(t, "POST", "/files?path=/tmp/kept.txt", "kept", nil, append(envd, "Content-Type", "application/octet-stream")...); st != http.StatusOK {
		t.Fatalf("upload: %d", st)
	}
	// A port of the sandbox, reached through the gateway (E2B's getHost): busybox httpd.
	g.cli("exec", c.SandboxID, "sh", "-c", "mkdir -p /tmp/www && echo hi-from-the-sandbox > /tmp/www/index.html && busybox httpd -p 8080 -h /tmp/www")
	var got []byte
	testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "the sandbox's web server through the gateway", func() bool {
		req, _ := http.NewRequest("GET", g.url+"/index.html", nil)
		req.Header.Set("E2b-Sandbox-Id", c.SandboxID)
		req.Header.Set("E2b-Sandbox-Port", "8080")
		req.Header.Set("E2b-Traffic-Access-Token", c.EnvdAccessToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		got, _ = io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK
	})
	if string(got) != "hi-from-the-sandbox\n" {
		t.Errorf("port 8080 through the gateway answered %q", got)
	}
	req, _ := http.NewRequest("GET", g.url+"/index.html", nil)
	req.Host = "8080-" + c.SandboxID + ".e2b.test" // the SDK's getHost(8080) form, without the token
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("port 8080 without the token: %v %v", resp, err)
	}
	g.stop()
	g.start()
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the E2B listener after the restart", func() bool {
		resp, err := http.Get(g.url + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	var info struct {
		State    string            `json:"state"`
		Metadata map[string]string `json:"metadata"`
	}
	if st := g.e2bCall(t, "GET", "/sandboxes/"+c.SandboxID, "", &info, "X-API-KEY", g.key); st != http.StatusOK || info.State != "running" || info.Metadata["k"] != "v" {
		t.Fatalf("info after the restart: %d %+v", st, info)
	}
	if st := g.e2bCall(t, "GET", "/sandboxes/"+c.SandboxID, "", nil, "X-API-KEY", g.otherKey); st != http.StatusNotFound {
		t.Errorf("the other tenant after the restart: %d, want 404", st)
	}
	req, _ = http.NewRequest("GET", g.url+"/files?path=/tmp/kept.txt", nil)
	req.Header.Set(envd[0], envd[1])
	req.Header.Set(envd[2], envd[3])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(data) != "kept" {
		t.Errorf("the file after the restart: %d %q", resp.StatusCode, data)
	}
	if st := g.e2bCall(t, "DELETE", "/sandboxes/"+c.SandboxID, "", nil, "X-API-KEY", g.key); st != http.StatusNoContent {
		t.Errorf("kill after the restart: %d", st)
	}
}
