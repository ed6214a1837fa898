package integration

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestForkFromReadySandboxes forks from a checkpoint without processes while the source's
// (user-namespaced) pool has sandboxes ready: each fork is a ready sandbox moved onto the
// shared layer (pool/reroot_linux.go), not a new container. Each shows the checkpoint's files
// and state with its own identity (ID, address, hostname, machine ID, seed, id range), its
// mounts (proc, dev, sys, the init's) work in the new root and the old root is gone, writes
// stay its own, a checkpoint and rollback of it work over the layer, a restarted daemon finds
// the forks on the layer again, and releasing the forks removes the layer; the pool's next
// sandboxes are fresh.
func TestForkFromReadySandboxes(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 4, "--max", "16")
	id := d.lease("bb").ID
	const srcMachineID = "0123456789abcdef0123456789abcdef"
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo base > /w/a && rm /etc/group && echo "+srcMachineID+" > /etc/machine-id")
	d.cli("state", "patch", id, `[{"op":"add","path":"/v","value":"base"}]`)
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo later > /w/a")
	d.waitReady("bb", 4, 2*time.Minute)

	cl, ctx := d.client(), context.Background()
	leases, err := cl.ForkWith(ctx, id, api.SnapshotRequest{Count: 3, From: ck.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "3 forks made of ready sandboxes moved onto the layer", func() bool {
		return strings.Count(d.logs.String(), "ready sandbox moved onto a fork layer") == 3
	})
	layers := d.forkLowers()
	if len(layers) != 1 {
		t.Fatalf("fork layers listed: %v, want 1", layers)
	}
	seen := map[string]map[string]bool{}
	for _, l := range leases {
		if l.ForkedFrom != id+"@"+ck.ID || l.Cold {
			t.Errorf("fork %+v: want a warm sandbox labelled forked_from %s@%s", l, id, ck.ID)
		}
		out := d.cli("exec", l.ID, "--", "sh", "-c", "cat /w/a; [ -e /etc/group ] && echo group; stat -c %u:%g /w/a /etc/passwd; hostname; echo $DELTABOX_SEED; cat /etc/machine-id; "+
			"[ -e /proc/1/status ] && [ -c /dev/null ] && [ -d /sys/fs ] && echo mounts; grep -c ' / / ' /proc/self/mountinfo; cat /proc/self/uid_map | tr -s ' ' | cut -d' ' -f3")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 9 || lines[0] != "base" || lines[1] != "0:0" || lines[2] != "0:0" || lines[4] == "" ||
			len(lines[5]) != 32 || lines[5] == srcMachineID || lines[6] != "mounts" || lines[7] != "1" {
			t.Errorf("fork %s files/identity/mounts: %q", l.ID, out)
			continue
		}
		for k, v := range map[string]string{"host": lines[3], "seed": lines[4], "machine-id": lines[5], "ip": l.IP, "uid-range": lines[8]} {
			if seen[k] == nil {
				seen[k] = map[string]bool{}
			}
			seen[k][v] = true
		}
		if got := d.stateDoc(l.ID); got != `{"v":"base"}` {
			t.Errorf("fork %s state %s", l.ID, got)
		}
	}
	for k, vs := range seen {
		if len(vs) != 3 {
			t.Errorf("forks share a %s: %v", k, vs)
		}
	}

	f0, f1 := leases[0].ID, leases[1].ID
	d.cli("exec", f0, "--", "sh", "-c", "echo mine > /w/a && echo new > /w/b")
	if out := d.cli("exec", f1, "--", "sh", "-c", "cat /w/a; [ -e /w/b ] && echo b; true"); out != "base\n" {
		t.Errorf("another fork sees a fork's write: %q", out)
	}
	if out := d.cli("exec", id, "--", "cat", "/w/a"); out != "later\n" {
		t.Errorf("the source sees a fork's write: %q", out)
	}
	var fck api.Checkpoint
	d.cliJSON(&fck, "checkpoint", "create", f0)
	d.cli("exec", f0, "--", "sh", "-c", "echo again > /w/a && rm /w/b")
	d.cli("rollback", f0, "--to", fck.ID)
	if out := d.cli("exec", f0, "--", "cat", "/w/a", "/w/b"); out != "mine\nnew\n" {
		t.Errorf("fork after its rollback: %q", out)
	}

	// A daemon killed while they run finds them again on the layer (their container label).
	d.kill()
	d.start()
	if out := d.cli("exec", f1, "--", "sh", "-c", "cat /w/a; [ -e /etc/group ] && echo group; true"); out != "base\n" {
		t.Errorf("a moved fork after a daemon restart: %q", out)
	}
	if got := d.forkLowers(); len(got) != 1 || got[0] != layers[0] {
		t.Errorf("fork layers after a restart: %v, want %v", got, layers)
	}
	for _, l := range leases {
		d.cli("release", l.ID)
	}
	testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "the layer removed", func() bool {
		_, err := os.Stat(layers[0])
		return os.IsNotExist(err) && len(d.forkLowers()) == 0
	})
	fresh := d.lease("bb")
	if out := d.cli("exec", fresh.ID, "--", "sh", "-c", "[ -e /w ] && echo w; [ -e /etc/group ] && echo group"); out != "group\n" {
		t.Errorf("a sandbox leased after the forks: %q", out)
	}
}

// TestForkMovedL3Rollback: a fork made of a ready sandbox moved onto the layer (user-namespaced
// pool) takes an L3 checkpoint with a process running and rolls back to it: the restored task's
// root stacks the layer again (the layer's files, the fork's own write, the process back).
func TestForkMovedL3Rollback(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 2, "--max", "8")
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo base > /w/a")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id)
	d.waitReady("bb", 2, 2*time.Minute)
	forks, err := d.client().ForkWith(context.Background(), id, api.SnapshotRequest{Count: 1, From: ck.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the fork made of a ready sandbox", func() bool {
		return strings.Contains(d.logs.String(), "ready sandbox moved onto a fork layer")
	})
	f := forks[0].ID
	d.cli("exec", f, "--", "sh", "-c", "echo own > /w/b")
	d.cli("exec", "-d", f, "--", "sleep", "1000")
	var l3 api.Checkpoint
	d.cliJSON(&l3, "checkpoint", "create", f, "--level", "l3")
	d.cli("exec", f, "--", "sh", "-c", "echo later > /w/a && kill $(ps -o pid,args | grep '[s]leep 1000' | awk '{print $1}')")
	d.cli("rollback", f, "--to", l3.ID)
	out, errOut, code := d.cliRaw("exec", f, "--", "sh", "-c", "cat /w/a /w/b; ps -o args | grep -c '^[s]leep 1000'")
	if code != 0 || out != "base\nown\n1\n" {
		t.Errorf("moved fork after an L3 rollback: %q %q (exit %d)", out, errOut, code)
	}
}
