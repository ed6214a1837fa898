package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/network"
)

// destroyNodeContainers removes every container a test daemon left behind (daemons keep
// sandboxes running across restarts by design, so tests clean up after them).
func destroyNodeContainers(t testing.TB, e env, root string) {
	data, err := os.ReadFile(filepath.Join(root, "node-id"))
	if err != nil {
		return
	}
	node := strings.TrimSpace(string(data))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := containerd.New(e.containerd, containerd.WithDefaultNamespace("deltabox"))
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer client.Close()
	cs, err := client.Containers(ctx, fmt.Sprintf(`labels.%q==%s`, pool.LabelNode, node))
	if err != nil {
		t.Errorf("cleanup: list containers: %v", err)
		return
	}
	for _, c := range cs {
		if task, err := c.Task(ctx, nil); err == nil {
			_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
			if st, err := task.Wait(ctx); err == nil {
				select {
				case <-st:
				case <-time.After(10 * time.Second):
				}
			}
			_, _ = task.Delete(ctx, containerd.WithProcessKill)
		}
	}
	if err := pool.UnmountDisks(filepath.Join(root, "pool", "containers"), nil); err != nil { // before the snapshots go
		t.Errorf("cleanup: %v", err)
	}
	for _, c := range cs {
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("cleanup: delete %s: %v", c.ID(), err)
		}
	}
	// The shared fork layers its forks used (in memory: a leak would hold the host's RAM).
	if list, err := os.ReadFile(filepath.Join(root, "pool", "forklowers.list")); err == nil {
		for _, dir := range strings.Fields(string(list)) {
			if strings.Contains(dir, "/deltabox-forklowers") {
				_ = os.RemoveAll(dir)
			}
		}
	}
}

// testNet is one test daemon's private sandbox network.
type testNet struct {
	name   string
	subnet netip.Prefix
	lock   *os.File // held while the network is in use (nil: none could be taken)
}

// testNetwork picks a network number from n on that no other test process holds: its lock
// file is flocked until uninstall (or the process exits). Two test processes on one network
// name tear down each other's namespaces and bridge: a soak once lost all its leases that way.
func testNetwork(n int) testNet {
	for i := range 200 {
		k := (n+i)%200 + 20
		f, err := os.OpenFile(fmt.Sprintf("/tmp/deltabox-testnet-%d.lock", k), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			break
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			return testNet{name: fmt.Sprintf("dbxt%d", k), subnet: netip.MustParsePrefix(fmt.Sprintf("10.215.%d.0/24", k)), lock: f}
		}
		f.Close()
	}
	k := n%200 + 20
	return testNet{name: fmt.Sprintf("dbxt%d", k), subnet: netip.MustParsePrefix(fmt.Sprintf("10.215.%d.0/24", k))}
}

func (n testNet) toml() string {
	return fmt.Sprintf("version = 1\n[network]\nname = %q\nbridge = %q\nsubnet = %q\n", n.name, n.name, n.subnet)
}

// uninstall removes the network's bridge, firewall chains and leftovers. Tasks killed just
// before may keep a namespace busy for a moment, so it retries.
func (n testNet) uninstall(t testing.TB) {
	ctx := context.Background()
	var err error
	for range 10 {
		var m *network.Manager
		m, err = network.New(ctx, network.Options{StateDir: t.TempDir(), NetworkName: n.name, Bridge: n.name, Subnet: n.subnet, ProxyPort: 3128})
		if err == nil {
			if err = m.Uninstall(ctx); err == nil {
				n.release()
				return
			}
		}
		time.Sleep(time.Second)
	}
	t.Logf("could not remove test network %s: %v", n.name, err)
	n.release()
}

// release lets other test processes have the network number again.
func (n testNet) release() {
	if n.lock != nil {
		n.lock.Close()
	}
}
