package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// The L3 part of the fault suite: the daemon dies (failpoint "exit") or fails ("error") at
// each phase of a snapshot push and of a restore (internal/failpoint; docs/operations.md),
// and each case checks the one outcome it must have. One daemon, pool and sandbox serve all
// cases; the snapshot the last push case completes is the one the restore cases restore.

// l3Sleeper leases a busybox sandbox running a sleep that a dump and restore must keep.
func l3Sleeper(d *daemon) string {
	d.createPool("bb", busyboxImage, 1, "--max", "6")
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "sleep 100000 </dev/null >/dev/null 2>&1 &")
	testutil.WaitFor(d.t, 5*time.Second, 20*time.Millisecond, "the sleep to start", func() bool {
		_, _, code := d.cliRaw("exec", id, "--", "sh", "-c", sleepRuns)
		return code == 0
	})
	return id
}

// sleepRuns succeeds (and names the process) when a sleep runs in the sandbox.
const sleepRuns = "ps -o args | grep '^sleep 100000'"

// checkSleeps asserts that a sandbox is neither paused nor frozen (an exec answers) and that
// its sleep still runs.
func (d *daemon) checkSleeps(id string) {
	d.t.Helper()
	if out, errOut, code := d.cliRaw("exec", id, "--timeout", "10s", "--", "sh", "-c", sleepRuns); code != 0 || strings.TrimSpace(out) == "" {
		d.t.Fatalf("sandbox %s is stuck or lost its sleep: exit %d, %q %q\n%s", id, code, out, errOut, d.logTail())
	}
}

func (d *daemon) snapshotNames() []string {
	d.t.Helper()
	snaps, err := d.client().Snapshots(context.Background(), "")
	if err != nil {
		d.t.Fatal(err)
	}
	names := make([]string, len(snaps))
	for i, s := range snaps {
		names[i] = s.Name
	}
	return names
}

func (d *daemon) sandboxIDs() map[string]bool {
	d.t.Helper()
	sbs, err := d.client().Sandboxes(context.Background())
	if err != nil {
		d.t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, sb := range sbs {
		ids[sb.ID] = true
	}
	return ids
}

// checkNoPush asserts that an interrupted push of sandbox id left no snapshot: none listed,
// and a restore of the name it would have had (the sandbox's last checkpoint) is not_found.
func (d *daemon) checkNoPush(id string) {
	d.t.Helper()
	if names := d.snapshotNames(); len(names) != 0 {
		d.t.Fatalf("interrupted push left snapshots %v", names)
	}
	ids := d.checkpointIDs(id)
	name := id + "-" + ids[len(ids)-1]
	if _, err := d.client().Restore(context.Background(), name, "", nil); !errdefs.IsNotFound(err) {
		d.t.Fatalf("restore of %s after an interrupted push: %v, want not_found", name, err)
	}
}

// checkNoRestore asserts that an interrupted restore left nothing: no new sandbox listed, no
// fetched snapshot (on disk or in memory) or CRIU work dir, no containerd container beyond
// the containers before.
func (d *daemon) checkNoRestore(before map[string]bool, containers int) {
	d.t.Helper()
	for sb := range d.sandboxIDs() {
		if !before[sb] {
			d.t.Fatalf("interrupted restore left sandbox %s listed", sb)
		}
	}
	for _, sub := range []string{"restore", "restore-mem", "criu-work"} {
		testutil.WaitFor(d.t, 10*time.Second, 20*time.Millisecond, sub+" to be empty", func() bool {
			left, err := os.ReadDir(filepath.Join(d.root, sub))
			return (err == nil || os.IsNotExist(err)) && len(left) == 0
		})
	}
	testutil.WaitFor(d.t, 20*time.Second, 50*time.Millisecond, "the half-restored container to go", func() bool {
		return d.nodeContainers() == containers
	})
}

// restoreOnce restores uri, checks the sleep came along, and releases the restored sandbox.
func (d *daemon) restoreOnce(uri string) {
	d.t.Helper()
	n := d.nodeContainers()
	var l api.Lease
	lastJSON(d.t, d.cli("-o", "json", "restore", uri), &l)
	d.checkSleeps(l.ID)
	d.cli("release", l.ID) // the pool has its ready sandbox: this one is destroyed
	testutil.WaitFor(d.t, 20*time.Second, 50*time.Millisecond, "the released restore's container to go", func() bool {
		return d.nodeContainers() == n
	})
}

func TestFaultsL3(t *testing.T) {
	d := startDaemon(t)
	id := l3Sleeper(d)
	pushPoints := []string{"l3/dumped", "push/packaged", "push/blobs-uploaded"}
	for _, p := range pushPoints {
		t.Run("push-exit-"+strings.ReplaceAll(p, "/", "-"), func(t *testing.T) {
			d.t = t
			d.crashAt(p, "snapshot", "push", id)
			d.checkSleeps(id)
			d.checkNoPush(id)
		})
	}
	t.Run("push-error", func(t *testing.T) {
		d.t = t
		for _, p := range pushPoints {
			d.restartWith(p + "=error")
			_, errOut, code := d.cliRaw("snapshot", "push", id)
			if code == 0 || !strings.Contains(errOut, p) {
				t.Fatalf("push with %s=error: exit %d, %q; want the failpoint's error", p, code, errOut)
			}
			d.checkSleeps(id)
			d.checkNoPush(id)
		}
		d.restartWith("")
	})
	var uri string
	t.Run("push-exit-push-manifest-written", func(t *testing.T) {
		d.t = t
		d.crashAt("push/manifest-written", "snapshot", "push", id) // the next push of this sandbox works
		d.checkSleeps(id)
		names := d.snapshotNames()
		ids := d.checkpointIDs(id)
		if want := id + "-" + ids[len(ids)-1]; len(names) != 1 || names[0] != want {
			t.Fatalf("snapshots after a push killed after its manifest: %v, want [%s]", names, want)
		}
		uri = names[0]
	})
	if uri == "" {
		t.FailNow()
	}
	restorePoints := []string{"restore/verified", "restore/fetched", "restore/container-created", "restore/restored"}
	for _, p := range restorePoints {
		t.Run("restore-exit-"+strings.ReplaceAll(p, "/", "-"), func(t *testing.T) {
			d.t = t
			before, n := d.sandboxIDs(), d.nodeContainers()
			d.crashAt(p, "restore", uri)
			d.checkNoRestore(before, n)
			d.restoreOnce(uri)
		})
	}
	t.Run("restore-error", func(t *testing.T) {
		d.t = t
		for _, p := range restorePoints {
			d.restartWith(p + "=error")
			before, n := d.sandboxIDs(), d.nodeContainers()
			_, errOut, code := d.cliRaw("restore", uri)
			if code == 0 || !strings.Contains(errOut, p) {
				t.Fatalf("restore with %s=error: exit %d, %q; want the failpoint's error", p, code, errOut)
			}
			d.checkNoRestore(before, n)
		}
		d.restartWith("")
		d.restoreOnce(uri)
	})
	d.t = t
}
