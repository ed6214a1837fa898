package proxy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// curl runs curl through the proxy from 127.0.0.2, trusting only the proxy's CA.
func curl(t *testing.T, e *testEnv, args ...string) string {
	t.Helper()
	bin := testutil.RequiresBinary(t, "curl")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, e.p.CACertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"-sS", "--max-time", "10", "-x", "http://" + e.addr, "--interface", "127.0.0.2", "--cacert", ca, "-D", "-"}
	cmd := exec.Command(bin, append(base, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no *_proxy or CA variables from the caller
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("curl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func TestCurlThroughProxy(t *testing.T) {
	up := newUpstream(t, true)
	e := newEnv(t, WithUpstreamRootsPEM(up.certPEM()))
	e.register(2, "sb-a", basePolicy(up.hostPort()))

	out := curl(t, e, up.URL+"/via-curl")
	if !strings.Contains(out, "HTTP/1.1 200") || !strings.HasSuffix(out, "hello GET /via-curl") {
		t.Fatalf("GET output:\n%s", out)
	}
	out = curl(t, e, "-X", "POST", "--data", "payload", up.URL+"/held")
	if !strings.Contains(out, "HTTP/1.1 202") || !strings.Contains(out, `"held":true`) {
		t.Fatalf("POST output:\n%s", out)
	}
	out = curl(t, e, "-X", "DELETE", up.URL+"/nope")
	if !strings.Contains(out, "HTTP/1.1 403") || !strings.Contains(strings.ToLower(out), "x-deltabox-reason: denied by policy") {
		t.Fatalf("DELETE output:\n%s", out)
	}
	if got := up.seen(); len(got) != 1 || got[0].Path != "/via-curl" {
		t.Fatalf("upstream saw %+v", got)
	}
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Released != 1 {
		t.Fatalf("commit %+v %v", res, err)
	}
	if got := up.seen(); len(got) != 2 || got[1].Body != "payload" {
		t.Fatalf("upstream saw %+v", got)
	}
}
