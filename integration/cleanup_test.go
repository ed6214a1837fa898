package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/pool"
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
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("cleanup: delete %s: %v", c.ID(), err)
		}
	}
}
