package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/objectstore/s3test"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/snapsign"
)

// counterScript keeps a counter in memory (and 20 MB of heap) and writes it out every 50 ms:
// after a restore it must continue from about the dumped value, not from 0.
const counterScript = `cat > /counter.py <<'PY'
import os, time
ballast = os.urandom(20 << 20)
n = 0
while True:
    n += 1
    with open("/tmp/count.new", "w") as f:
        f.write(str(n))
    os.rename("/tmp/count.new", "/tmp/count")
    time.sleep(0.05)
PY
nohup python3 /counter.py >/dev/null 2>&1 &
while [ ! -s /tmp/count ]; do sleep 0.05; done`

func (d *daemon) count(id string) int {
	d.t.Helper()
	for range 50 {
		out, _, code := d.cliRaw("exec", id, "--", "cat", "/tmp/count")
		if v, err := strconv.Atoi(strings.TrimSpace(out)); code == 0 && err == nil {
			return v
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.t.Fatalf("no counter in sandbox %s", id)
	return 0
}

// startCounter leases a python sandbox running the counter, with a file and state to keep.
func startCounter(d *daemon) string {
	d.createPool("py", pythonImage, 1, "--max", "12")
	id := d.lease("py").ID
	d.cli("exec", id, "--timeout", "30s", "--", "sh", "-c", counterScript)
	d.cli("state", "patch", id, `[{"op":"add","path":"/memory","value":"kept in the snapshot"}]`)
	d.cli("exec", id, "--", "sh", "-c", "echo file-content > /root/notes")
	first := d.count(id)
	testutil.WaitFor(d.t, 10*time.Second, 20*time.Millisecond, "counter to run", func() bool { return d.count(id) > first })
	return id
}

// restoreSlack is how far a restored counter (a tick every 50 ms) may have run on by the time
// checkContinues reads it: 1.5 s, for the end of the restore (network, init) and the exec that
// reads it on a loaded machine (10 ticks were seen exceeded once).
const restoreSlack = 30

// checkContinues asserts that a restored counter resumed at or after from (and not far past
// it), that it runs, and that files and state came along.
func checkContinues(t *testing.T, d *daemon, id string, from, to int) {
	t.Helper()
	first := d.count(id)
	if first < from || first > to {
		t.Errorf("sandbox %s: counter at %d after restore, want it to continue between %d and %d", id, first, from, to)
	}
	testutil.WaitFor(t, 5*time.Second, 50*time.Millisecond, "counter to advance", func() bool { return d.count(id) > first })
	if out := d.cli("exec", id, "--", "cat", "/root/notes"); out != "file-content\n" {
		t.Errorf("sandbox %s: files not restored: %q", id, out)
	}
	// In its own user namespace: the processes run as its range's host ids (not the dumped
	// sandbox's), and the files it got are its root's.
	m := mappingOf(t, d, id)
	want := fmt.Sprintf("0 %d %d", m.HostID, m.Size)
	for _, pid := range []string{"self", "1"} {
		if got := strings.Join(strings.Fields(d.cli("exec", id, "--", "cat", "/proc/"+pid+"/uid_map")), " "); got != want {
			t.Errorf("sandbox %s: uid_map of %s %q, want %q", id, pid, got, want)
		}
	}
	if out := d.cli("exec", id, "--", "stat", "-c", "%u:%g", "/root/notes"); out != "0:0\n" {
		t.Errorf("sandbox %s: /root/notes owned by %q inside, want 0:0", id, out)
	}
	var memo string
	d.cliJSON(&memo, "state", "get", id, "/memory")
	if memo != "kept in the snapshot" {
		t.Errorf("sandbox %s: state not restored: %q", id, memo)
	}
}

// lastJSON decodes the last line of a JSON-lines output.
func lastJSON(t testing.TB, out string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("last line of %q: %v", out, err)
	}
}

func TestL3RollbackRestoresProcessesInPlace(t *testing.T) {
	d := startDaemon(t)
	id := startCounter(d)
	before := d.count(id)
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--level", "l3")
	after := d.count(id)
	if ck.Level != "l3" || ck.FrozenMS <= 0 {
		t.Fatalf("unexpected L3 checkpoint: %+v", ck)
	}
	testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "counter to run on after the checkpoint", func() bool {
		return d.count(id) >= after+restoreSlack+10 // past what a restored counter may show
	})
	d.cli("exec", id, "--", "sh", "-c", "rm /root/notes")
	d.cli("rollback", id, "--to", ck.ID)
	checkContinues(t, d, id, before, after+restoreSlack)
	// The daemon set favordynmods on the node's cgroup2 hierarchy (its default); CRIU's dump
	// and restore went through the daemon's cgroup yard and left it (a cgroup2 mount of their
	// own resets the node's flags).
	if opts := cgroup2Flags(t); !strings.Contains(opts, "favordynmods") {
		t.Fatalf("after an L3 checkpoint and rollback the node's cgroup2 options are %q: CRIU took favordynmods off", opts)
	}
}

// cgroup2Flags returns the super options of the node's first cgroup2 mount.
func cgroup2Flags(t testing.TB) string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil || len(ms) == 0 {
		t.Fatalf("cgroup2 mounts: %v (%d)", err, len(ms))
	}
	return ms[0].VFSOptions
}

func TestSnapshotPushRestoreAndFork(t *testing.T) {
	d := startDaemon(t)
	id := startCounter(d)
	before := d.count(id)
	out := d.cli("-o", "json", "snapshot", "push", id)
	after := d.count(id)
	var snap api.Snapshot
	lastJSON(t, out, &snap)
	if snap.URI == "" || !strings.Contains(out, `"progress"`) {
		t.Fatalf("push -o json: want progress lines then the snapshot: %q", out)
	}
	var l api.Lease
	lastJSON(t, d.cli("-o", "json", "restore", snap.URI), &l)
	if l.ID == "" || l.ID == id {
		t.Fatalf("restore gave %+v", l)
	}
	checkContinues(t, d, l.ID, before, after+restoreSlack)
	checkStagedInMemory(t, d)
	var snaps []api.Snapshot
	d.cliJSON(&snaps, "snapshot", "ls")
	if len(snaps) != 1 || snaps[0].Name != snap.Name {
		t.Errorf("snapshot ls: %+v", snaps)
	}
	forkFrom := d.count(id)
	forks := strings.Fields(d.cli("fork", id, "--count", "3"))
	forkTo := d.count(id)
	if len(forks) != 3 {
		t.Fatalf("fork printed %v", forks)
	}
	for _, f := range forks {
		checkContinues(t, d, f, forkFrom, forkTo+restoreSlack)
	}
	d.cliJSON(&snaps, "snapshot", "ls")
	if len(snaps) != 1 || snaps[0].Name != snap.Name { // the fork removed the snapshot it pushed
		t.Errorf("after fork: %+v", snaps)
	}
	d.cli("snapshot", "rm", snap.URI)
	d.cliJSON(&snaps, "snapshot", "ls")
	if len(snaps) != 0 {
		t.Errorf("after rm: %+v", snaps)
	}
	d.stop() // a clean stop unmounts the restores' tmpfs
	if _, err := os.Stat(filepath.Join(d.root, "restore-mem")); !os.IsNotExist(err) {
		t.Errorf("after the daemon stopped <root>/restore-mem: %v, want it unmounted and gone", err)
	}
}

// checkStagedInMemory checks that the daemon's restores staged their downloads on its
// tmpfs (<root>/restore-mem) and left nothing there.
func checkStagedInMemory(t *testing.T, d *daemon) {
	t.Helper()
	mem := filepath.Join(d.root, "restore-mem")
	var staged int
	for _, line := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(line, `msg="snapshot fetched"`) {
			if !strings.Contains(line, " dir="+mem+"/") {
				t.Errorf("a restore staged outside %s: %s", mem, line)
			}
			staged++
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mem, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Errorf("%s: fs %#x, %v; want a tmpfs", mem, st.Type, err)
	}
	if entries, err := os.ReadDir(mem); err != nil || len(entries) != 0 {
		t.Errorf("the restores left %v in %s (%v)", entries, mem, err)
	}
	if staged == 0 {
		t.Error(`no "snapshot fetched" in the daemon's log`)
	}
}

func TestSnapshotAcrossNodesThroughS3(t *testing.T) {
	e1 := requireEnv(t)
	e2 := env{bin: e1.bin, containerd: testutil.RequiresEnv(t, "DELTABOX_CONTAINERD2_ADDRESS")}
	s3 := startS3(t)
	a := startDaemonOn(t, e1, "")
	b := startDaemonOn(t, e2, trustConfig(a))        // a fleet: B trusts A's signing key
	b.createPool("py", pythonImage, 0, "--max", "4") // and runs the same pools
	id := startCounter(a)
	before := a.count(id)
	var snap api.Snapshot
	lastJSON(t, a.cli("-o", "json", "snapshot", "push", id, "--to", s3.URI("nodes")), &snap)
	after := a.count(id)
	if !strings.HasPrefix(snap.URI, "s3://") {
		t.Fatalf("snapshot URI %q", snap.URI)
	}
	var l api.Lease
	lastJSON(t, b.cli("-o", "json", "restore", snap.URI), &l)
	checkContinues(t, b, l.ID, before, after+restoreSlack)
	var onB []api.Snapshot
	b.cliJSON(&onB, "snapshot", "ls", s3.URI("nodes"))
	if len(onB) != 1 {
		t.Errorf("node B lists %d snapshots in S3", len(onB))
	}
}

func TestSnapshotS3GoesAway(t *testing.T) {
	s3 := startS3(t)
	d := startDaemon(t)
	id := startCounter(d)
	c, ctx := d.client(), context.Background()
	s3.Stop()
	_, err := c.SnapshotPush(ctx, id, s3.URI("gone"), nil)
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("push to a stopped S3 server: want unavailable, got %v", err)
	}
	s3.Restart()
	if snaps, err := c.Snapshots(ctx, s3.URI("gone")); err != nil || len(snaps) != 0 {
		t.Fatalf("after a failed push the store lists %v (%v); want no snapshot", snaps, err)
	}
	if _, err := c.SnapshotPush(ctx, id, s3.URI("gone"), nil); err != nil {
		t.Fatalf("retry after the server came back: %v", err)
	}
}

func TestSnapshotBadInput(t *testing.T) {
	d := startDaemon(t)
	c, ctx := d.client(), context.Background()
	if _, err := c.Restore(ctx, "no-such-snapshot", "", nil); !errdefs.IsNotFound(err) {
		t.Errorf("restore of an unknown snapshot: want not_found, got %v", err)
	}
	store := "file://" + shortTempDir(t)
	id := startCounter(d)
	snap, err := c.SnapshotPush(ctx, id, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := c.Sandboxes(ctx)
	// A snapshot from a newer CRIU or another architecture is refused, naming why.
	for field, value := range map[string]any{"criuVersion": 990000, "arch": "riscv64"} {
		uri := rewriteConfig(t, store, snap.Name, field, value, d.signer())
		_, err := c.Restore(ctx, uri, "", nil)
		if !errdefs.IsFailedPrecondition(err) || !(strings.Contains(err.Error(), "CRIU") || strings.Contains(err.Error(), "riscv64")) {
			t.Errorf("restore with %s=%v: want failed_precondition naming it, got %v", field, value, err)
		}
	}
	// A blob whose content no longer matches its digest is refused; nothing is created.
	corruptBlob(t, store, snap.Name, "rootfs.tar.zst")
	if _, err := c.Restore(ctx, snap.URI, "", nil); err == nil || !strings.Contains(err.Error(), "sha256:") {
		t.Errorf("restore of a corrupted blob: want a digest error, got %v", err)
	}
	if after, _ := c.Sandboxes(ctx); len(after) != len(before) {
		t.Errorf("failed restores left sandboxes behind: %d before, %d after", len(before), len(after))
	}
}

// readSnapshot returns the manifest of a snapshot in a file:// store and a function giving
// the path of a blob.
func readSnapshot(t *testing.T, store, name string) (map[string]any, func(digest string) string) {
	t.Helper()
	root := strings.TrimPrefix(store, "file://")
	data, err := os.ReadFile(filepath.Join(root, "objects", "snapshots", name, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m, func(d string) string {
		return filepath.Join(root, "objects", "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
	}
}

// rewriteConfig stores a copy of a snapshot whose config has criu.<field> = value, signed by
// signer (the restoring node's key, so that only the check under test refuses it).
func rewriteConfig(t *testing.T, store, name, field string, value any, signer *snapsign.Signer) string {
	t.Helper()
	m, blobPath := readSnapshot(t, store, name)
	cfgDesc := m["config"].(map[string]any)
	data, err := os.ReadFile(blobPath(cfgDesc["digest"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["criu"].(map[string]any)[field] = value
	newData, _ := json.Marshal(cfg)
	sum := sha256.Sum256(newData)
	d := "sha256:" + hex.EncodeToString(sum[:])
	if err := os.WriteFile(blobPath(d), newData, 0o644); err != nil {
		t.Fatal(err)
	}
	cfgDesc["digest"], cfgDesc["size"] = d, len(newData)
	newName := name + "-" + field
	md, _ := json.Marshal(m)
	writeManifest(t, store, newName, md, signer)
	return store + "#" + newName
}

// corruptBlob flips a byte in the middle of a snapshot's blob titled title.
func corruptBlob(t *testing.T, store, name, title string) {
	t.Helper()
	m, blobPath := readSnapshot(t, store, name)
	for _, l := range m["layers"].([]any) {
		desc := l.(map[string]any)
		if desc["annotations"].(map[string]any)["org.opencontainers.image.title"] == title {
			p := blobPath(desc["digest"].(string))
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)/2] ^= 0xff
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no %s blob in %s", title, name)
}

// TestSnapshotRestoreIsFaithful: a restore keeps the lease's env, labels, egress policy and
// checkpoint history and records where it came from; a fork records its source and removes
// the snapshot it pushed unless asked to keep it.
func TestSnapshotRestoreIsFaithful(t *testing.T) {
	d := startDaemon(t)
	c, ctx := d.client(), context.Background()
	d.createPool("py", pythonImage, 0, "--max", "8")
	const denyAll = "version: 1\ndefault: deny\n" // narrower than the pool's built-in default
	policy := filepath.Join(t.TempDir(), "deny.yaml")
	if err := os.WriteFile(policy, []byte(denyAll), 0o644); err != nil {
		t.Fatal(err)
	}
	id := d.lease("py", "--env", "SECRET_TOKEN=tok-123", "--label", "job=42", "--egress-policy", policy).ID
	d.cli("exec", id, "--timeout", "30s", "--", "sh", "-c", counterScript)
	var step api.Checkpoint
	d.cliJSON(&step, "checkpoint", "create", id, "-m", "step one")
	snap, err := c.SnapshotPush(ctx, id, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Restore(ctx, snap.URI, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	faithful := func(sbID, last string) api.Sandbox {
		t.Helper()
		sb, err := c.Sandbox(ctx, sbID)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(sb.Env, "SECRET_TOKEN=tok-123") || sb.Labels["job"] != "42" || sb.EgressPolicy != denyAll {
			t.Errorf("sandbox %s: env %v, labels %v, policy %q: want the source lease's", sbID, sb.Env, sb.Labels, sb.EgressPolicy)
		}
		if out := d.cli("exec", sbID, "--", "sh", "-c", "echo $SECRET_TOKEN"); out != "tok-123\n" {
			t.Errorf("sandbox %s: a new exec sees SECRET_TOKEN=%q", sbID, out)
		}
		var ckpts []api.Checkpoint
		d.cliJSON(&ckpts, "checkpoint", "ls", sbID)
		var ids []string
		for _, ck := range ckpts {
			ids = append(ids, ck.ID)
		}
		if len(ckpts) < 3 || ckpts[len(ckpts)-1].ID != last || !slices.ContainsFunc(ckpts, func(ck api.Checkpoint) bool {
			return ck.ID == step.ID && ck.Message == "step one"
		}) {
			t.Errorf("sandbox %s: checkpoints %v, want the source's history up to %s (with %s \"step one\")", sbID, ids, last, step.ID)
		}
		return sb
	}
	if sb := faithful(l.ID, snap.Checkpoint); sb.RestoredFrom != snap.URI {
		t.Errorf("restored_from = %q, want %q", sb.RestoredFrom, snap.URI)
	}
	var inspected map[string]any
	d.cliJSON(&inspected, "inspect", l.ID)
	if inspected["restored_from"] != snap.URI {
		t.Errorf("inspect -o json: restored_from = %v", inspected["restored_from"])
	}

	forks, err := c.Fork(ctx, id, "", 1, nil)
	if err != nil || len(forks) != 1 {
		t.Fatalf("fork: %v %v", forks, err)
	}
	// The fork's snapshot is the source's next checkpoint.
	next := strconv.Itoa(ckptNum(t, snap.Checkpoint) + 1)
	if sb := faithful(forks[0].ID, next); sb.ForkedFrom != id+"@"+next {
		t.Errorf("forked_from = %q, want %s@%s", sb.ForkedFrom, id, next)
	}
	snaps, _ := c.Snapshots(ctx, "")
	if len(snaps) != 1 {
		t.Errorf("after a fork the store holds %d snapshots, want only the pushed one", len(snaps))
	}
	if _, err := c.ForkWith(ctx, id, api.SnapshotRequest{Count: 1, KeepSnapshot: true}, nil); err != nil {
		t.Fatal(err)
	}
	if snaps, _ = c.Snapshots(ctx, ""); len(snaps) != 2 {
		t.Errorf("after fork --keep-snapshot the store holds %d snapshots, want 2", len(snaps))
	}
}

func ckptNum(t *testing.T, id string) int {
	t.Helper()
	n, err := strconv.Atoi(id)
	if err != nil {
		t.Fatalf("checkpoint ID %q is not a number", id)
	}
	return n
}

// startS3 starts an S3 server and points the test's environment, and so the daemons it
// starts, at it.
func startS3(t *testing.T) *s3test.Server {
	t.Helper()
	s3 := s3test.Start(t)
	for _, kv := range s3.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return s3
}
