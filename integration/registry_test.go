package integration

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestPoolFromRegistry creates a pool from an image containerd does not have: the daemon pulls
// it from a real OCI registry (distribution, installed by hack/install-deps.sh) on localhost,
// over plain HTTP as local registries are (docs/images.md).
func TestPoolFromRegistry(t *testing.T) {
	bin := testutil.RequiresBinary(t, "distribution-registry")
	d := startDaemon(t)
	addr := startRegistry(t, bin)
	ref := fmt.Sprintf("localhost:%s/deltabox/busybox:pulled", strings.Split(addr, ":")[1])
	ctrNS := func(args ...string) string {
		out, err := exec.Command("ctr", append([]string{"--address", d.env.containerd, "-n", "deltabox"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ctrNS("images", "tag", "--force", busyboxImage, ref)
	ctrNS("images", "push", "--plain-http", ref)
	ctrNS("images", "rm", ref) // the daemon must fetch it
	t.Cleanup(func() {
		exec.Command("ctr", "--address", d.env.containerd, "-n", "deltabox", "images", "rm", ref).Run()
	})
	d.cli("pool", "create", "pulled", "--image", ref, "--min-ready", "1", "--wait")
	l := d.lease("pulled")
	if out := d.cli("exec", l.ID, "echo", "from the registry"); out != "from the registry\n" {
		t.Fatalf("exec in the pulled image: %q", out)
	}
	missing := fmt.Sprintf("localhost:%s/deltabox/none:1", strings.Split(addr, ":")[1])
	_, errOut, code := d.cliRaw("pool", "create", "none", "--image", missing)
	if code != 1 || !strings.Contains(errOut, "not_found") || !strings.Contains(errOut, missing) {
		t.Fatalf("pool from an image the registry does not have: exit %d, %q", code, errOut)
	}
}

// startRegistry runs the distribution registry on a free localhost port with its storage in a
// temp dir and returns its host:port.
func startRegistry(t *testing.T, bin string) string {
	dir := shortTempDir(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := filepath.Join(dir, "config.yml")
	writeFile(t, cfg, fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr))
	cmd := exec.Command(bin, "serve", cfg)
	logs := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("registry log:\n%s", logs)
		}
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testutil.WaitFor(t, 20*time.Second, 50*time.Millisecond, "the registry to answer", func() bool {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return addr
}
