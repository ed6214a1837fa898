package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestLeasedSandboxWithoutItsNetworkIsQuarantined: a leased sandbox whose task runs but whose
// network record is gone at start (its namespace pin removed behind the daemon's back, as a
// test daemon sharing the network name once did to the soak) is quarantined with its session,
// not destroyed with the user's checkpoints and state; `sandbox destroy` is the way out.
func TestLeasedSandboxWithoutItsNetworkIsQuarantined(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	l := d.lease("bb")
	d.cli("checkpoint", "create", l.ID)
	d.stop()
	pin := filepath.Join("/run/netns", d.net.name+"-"+l.Container)
	if err := syscall.Unmount(pin, syscall.MNT_DETACH); err != nil {
		t.Fatalf("unpin %s: %v", pin, err)
	}
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	d.start()
	sb, _ := findSandbox(d, l.ID)
	if sb.State != api.StateQuarantined || !strings.Contains(sb.Reason, "network") {
		t.Fatalf("leased sandbox without its network after a restart: state %q (%s), want quarantined naming the network", sb.State, sb.Reason)
	}
	if _, err := os.Stat(filepath.Join(d.root, "sandboxes", l.ID)); err != nil {
		t.Fatalf("session of the quarantined sandbox: %v", err)
	}
	d.cli("sandbox", "destroy", l.ID)
	if _, found := findSandbox(d, l.ID); found {
		t.Fatal("destroyed sandbox still listed")
	}
}
