package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// forkLowers returns the shared fork layers the daemon lists (pool/forklower.go).
func (d *daemon) forkLowers() []string {
	d.t.Helper()
	data, err := os.ReadFile(filepath.Join(d.root, "pool", "forklowers.list"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return strings.Fields(string(data))
}

// TestForkFromSharedLayer forks three sandboxes from a checkpoint without processes in a
// user-namespaced pool: the checkpoint is written once as a shared read-only layer that each
// fork stacks above the image. Each fork shows the checkpoint's files (a deleted image file
// stays hidden, an opaque dir hides the image's contents, owners are the sandbox's), writes
// stay its own, it has its own identity, a checkpoint and rollback of a fork work over the
// layer, a fork of a fork gets the layer's files folded in, and the layer is removed once
// its last fork is released.
func TestForkFromSharedLayer(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1, "--max", "16")
	id := d.lease("bb").ID
	const srcMachineID = "0123456789abcdef0123456789abcdef"
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo base > /w/a && rm /etc/group && rm -rf /var && mkdir -p /var/new && echo n > /var/new/f && ln -s /etc /w/link && echo "+srcMachineID+" > /etc/machine-id")
	d.cli("state", "patch", id, `[{"op":"add","path":"/v","value":"base"}]`)
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--name", "base")
	d.cli("exec", id, "--", "sh", "-c", "echo later > /w/a")

	cl, ctx := d.client(), context.Background()
	leases, err := cl.ForkWith(ctx, id, api.SnapshotRequest{Count: 3, From: "base"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 3 {
		t.Fatalf("forks: %+v", leases)
	}
	layers := d.forkLowers()
	if len(layers) != 1 {
		t.Fatalf("fork layers listed: %v, want 1", layers)
	}
	if _, err := os.Stat(layers[0]); err != nil {
		t.Fatalf("the shared layer: %v", err)
	}
	if !strings.Contains(d.logs.String(), "sandbox forked from a checkpoint on a shared layer") {
		t.Fatal("the forks were not made on the shared layer")
	}
	seeds, hosts, ips, machineIDs := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, l := range leases {
		if l.ID == id || l.ForkedFrom != id+"@"+ck.ID {
			t.Errorf("fork %+v: want a new sandbox labelled forked_from %s@%s", l, id, ck.ID)
		}
		out := d.cli("exec", l.ID, "--", "sh", "-c", "cat /w/a /var/new/f; readlink /w/link; [ -e /etc/group ] && echo group; [ -e /var/spool ] && echo spool; stat -c %u:%g /w/a /etc/passwd; hostname; echo $DELTABOX_SEED; cat /etc/machine-id")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 8 || lines[0] != "base" || lines[1] != "n" || lines[2] != "/etc" || lines[3] != "0:0" || lines[4] != "0:0" || lines[6] == "" ||
			len(lines[7]) != 32 || lines[7] == srcMachineID {
			t.Errorf("fork %s files/identity: %q", l.ID, out)
			continue
		}
		hosts[lines[5]], seeds[lines[6]], ips[l.IP], machineIDs[lines[7]] = true, true, true, true
		if got := d.stateDoc(l.ID); got != `{"v":"base"}` {
			t.Errorf("fork %s state %s", l.ID, got)
		}
	}
	if len(seeds) != 3 || len(hosts) != 3 || len(ips) != 3 || len(machineIDs) != 3 {
		t.Errorf("forks share an identity: seeds %v hostnames %v addresses %v machine IDs %v", seeds, hosts, ips, machineIDs)
	}

	// Another fork of the checkpoint while these run: on the same layer, not a new one.
	more, err := cl.ForkWith(ctx, id, api.SnapshotRequest{Count: 1, From: "base"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.forkLowers(); len(got) != 1 || got[0] != layers[0] {
		t.Errorf("a second fork call of the checkpoint: layers %v, want %v", got, layers)
	}
	if out := d.cli("exec", more[0].ID, "--", "cat", "/w/a"); out != "base\n" {
		t.Errorf("fork on the reused layer: %q", out)
	}
	d.cli("release", more[0].ID)

	// Independence: a fork's write is its own.
	f0, f1 := leases[0].ID, leases[1].ID
	d.cli("exec", f0, "--", "sh", "-c", "echo mine > /w/a && rm /var/new/f")
	if out := d.cli("exec", f1, "--", "cat", "/w/a", "/var/new/f"); out != "base\nn\n" {
		t.Errorf("another fork sees a fork's write: %q", out)
	}
	if out := d.cli("exec", id, "--", "cat", "/w/a"); out != "later\n" {
		t.Errorf("the source sees a fork's write: %q", out)
	}
	// Checkpoint and rollback of a fork, over the shared layer.
	var fck api.Checkpoint
	d.cliJSON(&fck, "checkpoint", "create", f0)
	d.cli("exec", f0, "--", "sh", "-c", "echo again > /w/a && echo n2 > /var/new/f")
	d.cli("rollback", f0, "--to", fck.ID)
	if out, _, code := d.cliRaw("exec", f0, "--", "sh", "-c", "cat /w/a; [ -e /var/new/f ] && echo f; true"); code != 0 || out != "mine\n" {
		t.Errorf("fork after its rollback: %q (exit %d)", out, code)
	}
	// A fork of the fork: its own layer holds the first layer's files folded in.
	second, err := cl.ForkWith(ctx, f0, api.SnapshotRequest{Count: 1, From: fck.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := d.cli("exec", second[0].ID, "--", "sh", "-c", "cat /w/a; [ -e /var/new/f ] && echo f; [ -e /etc/group ] && echo group; readlink /w/link"); out != "mine\n/etc\n" {
		t.Errorf("fork of a fork: %q", out)
	}
	if n := len(d.forkLowers()); n != 2 {
		t.Errorf("fork layers listed: %d, want 2", n)
	}

	// Release: a layer goes with its last fork, not before.
	first := layers[0]
	for _, l := range leases[:2] {
		d.cli("release", l.ID)
	}
	if _, err := os.Stat(first); err != nil {
		t.Fatalf("the layer went while a fork uses it: %v", err)
	}
	d.cli("release", leases[2].ID)
	testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "the first layer removed", func() bool {
		_, err := os.Stat(first)
		return os.IsNotExist(err)
	})
	d.cli("release", second[0].ID)
	testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "no layer listed", func() bool {
		return len(d.forkLowers()) == 0
	})
	if out := d.cli("exec", id, "--", "cat", "/w/a"); out != "later\n" {
		t.Errorf("the source after its forks went: %q", out)
	}
}

// TestForkLayerAcrossRestart: a daemon killed while forks run on a shared layer finds them
// again (their root filesystems stack the layer by their container label), keeps the layer
// while they live, removes a listed layer no container uses at start, and a fork's
// checkpoint still folds the layer in (a fork of it sees the layer's files).
func TestForkLayerAcrossRestart(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1, "--max", "8")
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo base > /w/a")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id)
	cl, ctx := d.client(), context.Background()
	forks, err := cl.ForkWith(ctx, id, api.SnapshotRequest{Count: 1, From: ck.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := forks[0].ID
	layers := d.forkLowers()
	if len(layers) != 1 {
		t.Fatalf("fork layers listed: %v", layers)
	}
	// A layer listed but used by no container (a daemon killed before its forks were made).
	stale := filepath.Join(filepath.Dir(layers[0]), "flm-stale0123456789")
	if err := os.MkdirAll(filepath.Join(stale, "w"), 0o700); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(d.root, "pool", "forklowers.list")
	data, err := os.ReadFile(list)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(list, append(data, []byte(stale+"\n")...), 0o600); err != nil {
		t.Fatal(err)
	}

	d.kill()
	d.start()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the unused listed layer survived the start: %v", err)
	}
	if _, err := os.Stat(layers[0]); err != nil {
		t.Fatalf("the layer of a running fork went at start: %v", err)
	}
	if out := d.cli("exec", f, "--", "cat", "/w/a"); out != "base\n" {
		t.Fatalf("fork after the restart: %q", out)
	}
	d.cli("exec", f, "--", "sh", "-c", "echo b > /w/b")
	var fck api.Checkpoint
	d.cliJSON(&fck, "checkpoint", "create", f)
	again, err := d.client().ForkWith(ctx, f, api.SnapshotRequest{Count: 1, From: fck.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := d.cli("exec", again[0].ID, "--", "cat", "/w/a", "/w/b"); out != "base\nb\n" {
		t.Errorf("fork of the fork after the restart: %q", out)
	}
	d.cli("release", f)
	d.cli("release", again[0].ID)
	testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "no layer listed", func() bool {
		return len(d.forkLowers()) == 0
	})
	if _, err := os.Stat(layers[0]); !os.IsNotExist(err) {
		t.Errorf("the layer survived its last fork: %v", err)
	}
}

// TestForkSnapshotFoldsLayer: an L3 snapshot of a fork made on a shared layer (a ready
// sandbox moved onto it: CRIU dumps a task whose root was replaced under it) holds the
// layer's files (the fork's files are the layer's and its own): the restored sandbox, on the
// image alone, sees both, and a file the fork deleted from the layer stays deleted.
func TestForkSnapshotFoldsLayer(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1, "--max", "8", "--no-userns") // L3 needs it
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo base > /w/a && echo gone > /w/g && rm /etc/group")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id)
	d.waitReady("bb", 1, 2*time.Minute) // the fork is a ready sandbox moved onto the layer
	forks, err := d.client().ForkWith(context.Background(), id, api.SnapshotRequest{Count: 1, From: ck.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the fork made of a ready sandbox", func() bool {
		return strings.Contains(d.logs.String(), "ready sandbox moved onto a fork layer")
	})
	f := forks[0].ID
	d.cli("exec", f, "--", "sh", "-c", "echo own > /w/b && rm /w/g")
	var snap api.Snapshot
	lastJSON(t, d.cli("-o", "json", "snapshot", "push", f), &snap)
	var l api.Lease
	lastJSON(t, d.cli("-o", "json", "restore", snap.URI), &l)
	d.cli("release", f)
	out := d.cli("exec", l.ID, "--", "sh", "-c", "cat /w/a /w/b; [ -e /w/g ] && echo g; [ -e /etc/group ] && echo group; true")
	if out != "base\nown\n" {
		t.Errorf("restored snapshot of a fork: %q", out)
	}
}
