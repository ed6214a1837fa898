package pool

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/testutil"
)

const busybox = "deltabox.local/busybox:latest"

// testEnv connects to the private containerd of `make test` and builds deltabox-init.
func testEnv(t *testing.T) (*containerd.Client, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	addr := testutil.RequiresEnv(t, "DELTABOX_CONTAINERD_ADDRESS")
	client, err := containerd.New(addr, containerd.WithDefaultNamespace("deltabox"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	initBin := os.Getenv("DELTABOX_INIT_BIN")
	if initBin == "" {
		initBin = filepath.Join(t.TempDir(), "deltabox-init")
		cmd := exec.Command("go", "build", "-o", initBin, "../cmd/deltabox-init")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build init: %v\n%s", err, out)
		}
	}
	return client, initBin
}

func newTestManager(t *testing.T, root string) *Manager {
	t.Helper()
	client, initBin := testEnv(t)
	m, err := NewManager(context.Background(), client, Options{Root: root, InitBinary: initBin, Node: "test-" + filepath.Base(root)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func removeAll(t *testing.T, m *Manager) {
	for _, p := range m.Pools() {
		if err := m.RemovePool(context.Background(), p.Name, true); err != nil {
			t.Errorf("remove pool %s: %v", p.Name, err)
		}
	}
	m.Close()
}

func TestLeaseExecRelease(t *testing.T) {
	m := newTestManager(t, t.TempDir())
	defer removeAll(t, m)
	ctx := context.Background()
	if _, err := m.CreatePool(ctx, Template{Name: "bb", Image: busybox, MinReady: 2, Max: 4, Env: []string{"A=template"}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, 20*time.Millisecond, "2 ready sandboxes", func() bool {
		p, _ := m.Pool("bb")
		return p.Ready == 2
	})
	res, err := m.Lease(ctx, "bb", LeaseRequest{Env: []string{"B=lease"}})
	if err != nil || res.Cold {
		t.Fatalf("lease: %v cold=%v", err, res.Cold)
	}
	var out bytes.Buffer
	st, err := m.Exec(ctx, res.ID, ExecRequest{Argv: []string{"sh", "-c", "echo $A $B $C"}, Env: []string{"C=exec"}}, nil, &out, &out)
	if err != nil || st.Code != 0 || strings.TrimSpace(out.String()) != "template lease exec" {
		t.Fatalf("exec: %v %+v %q", err, st, out.String())
	}
	if err := m.Release(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Exec(ctx, res.ID, ExecRequest{Argv: []string{"true"}}, nil, &out, &out); !errdefs.IsNotFound(err) {
		t.Fatalf("exec after release: want not found, got %v", err)
	}
}

func TestMissingImageAndPool(t *testing.T) {
	m := newTestManager(t, t.TempDir())
	defer removeAll(t, m)
	ctx := context.Background()
	_, err := m.CreatePool(ctx, Template{Name: "nope", Image: "deltabox.local/nope:1"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "deltabox.local/nope:1") {
		t.Fatalf("want not found naming the image, got %v", err)
	}
	if _, err := m.Lease(ctx, "nope", LeaseRequest{}); !errdefs.IsNotFound(err) {
		t.Fatalf("lease from unknown pool: want not found, got %v", err)
	}
}
