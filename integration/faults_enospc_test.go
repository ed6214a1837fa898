package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// ENOSPC on the state root (issue 12): the daemon's --root is a small tmpfs; with it full,
// every write path (checkpoint, state patch, held effect, commit, push) fails with
// resource_exhausted and changes nothing, a rollback fails the same way but stays pending (its
// intent record has its place on disk) and is finished first by the next commit, a release
// (which mostly deletes) succeeds and leaves nothing; the sandbox stays thawed, and once
// space is freed the sandbox rolls back to the last good checkpoint with its files, state and
// effects, the rolled-back effects are never sent and the committed one is sent once.
//
// The sandboxes' disks ([sandbox] disk, images reserved under <root>/pool/containers) would
// live on the state root too; they are off here so that only the daemon's records hit the
// full disk (TestFaultsDiskFullStateRoot fills a state root under a sandbox's disk).

// startDaemonOnTmpfs starts a daemon whose state root is a tmpfs of size bytes.
func startDaemonOnTmpfs(t *testing.T, size int64, extraConfig string) *daemon {
	t.Helper()
	e := requireEnv(t)
	dir := shortTempDir(t)
	d := &daemon{t: t, env: e, root: filepath.Join(dir, "root"), address: filepath.Join(dir, "api.sock")}
	if err := os.Mkdir(d.root, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,nr_inodes=8192,mode=0700", size), "tmpfs", d.root).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(d.root, syscall.MNT_DETACH) }) // runs last
	d.net = testNetwork(os.Getpid() + int(netSeq.Add(1)))
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(d.net.toml()+"\n"+extraConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyNodeContainers(t, e, d.root); d.net.uninstall(t) })
	d.args = []string{"--config", cfg}
	d.start()
	t.Cleanup(d.stop)
	return d
}

// fill writes a file in dir until the filesystem is full and returns a function that
// removes it again.
// topUp fills again what was freed on dir's filesystem since fill(t, dir): it appends to
// fill's file and takes any inode freed.
func topUp(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range []int{4096, 1} {
		buf := make([]byte, n)
		for {
			if _, err := f.Write(buf); err != nil {
				break
			}
		}
	}
	for i := 0; i <= 10000; i++ {
		g, err := os.Create(fmt.Sprintf("%s.top%d", path, i))
		if err != nil {
			break
		}
		g.Close()
	}
}

func fill(t *testing.T, dir string) func() {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range []int{1 << 20, 4096, 1} {
		buf := make([]byte, n)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", dir, err)
				}
				break
			}
		}
	}
	// A full tmpfs may still have inodes: take those too.
	for i := 0; ; i++ {
		g, err := os.Create(fmt.Sprintf("%s.%d", path, i))
		if err != nil {
			break
		}
		g.Close()
		if i > 10000 {
			t.Fatal("fill: inodes without end")
		}
	}
	return func() {
		matches, _ := filepath.Glob(path + "*")
		for _, m := range matches {
			os.Remove(m)
		}
	}
}

// failsFull checks that err is resource_exhausted naming the full disk.
func failsFull(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded on a full state root", what)
	}
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("%s on a full state root: %v; want resource_exhausted naming the full disk", what, err)
	}
}

func TestFaultsENOSPC(t *testing.T) {
	u := startUpstream(t)
	d := startDaemonOnTmpfs(t, 64<<20, fmt.Sprintf("[sandbox]\ndisk = \"0\"\n[egress]\nupstream_ca_file = %q\n", u.ca))
	policy := filepath.Join(shortTempDir(t), "policy.yaml")
	os.WriteFile(policy, []byte(egressPolicy), 0o644)
	d.createPool("net", pythonImage, 1, "--egress-policy", policy, "--no-userns")
	id := d.lease("net", noProxyBypass...).ID

	d.cli("exec", id, "--", "sh", "-c", "echo good > /root/f")
	d.cli("state", "patch", id, `[{"op":"add","path":"/v","value":"good"}]`)
	d.holdPost(id, u.plain.URL+"/good")
	var good api.Checkpoint
	d.cliJSON(&good, "checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo dirty > /root/f")
	d.holdPost(id, u.plain.URL+"/dirty")
	d.cli("exec", id, "--", "sh", "-c", "head -c 65536 /dev/zero > /root/big")
	before := d.checkpointIDs(id)

	free := fill(t, d.root)
	t.Cleanup(free)
	file := "dirty\n" // what the sandbox's file holds
	notFrozen := func(what string) {
		t.Helper()
		if out, _, code := d.cliRaw("exec", id, "--timeout", "10s", "--", "cat", "/root/f"); code != 0 || out != file {
			t.Fatalf("after %s on a full disk: exec %d %q, want the sandbox running with %q", what, code, out, file)
		}
	}
	ctx := context.Background()
	c := d.client()
	_, err := c.Checkpoint(ctx, id, api.CheckpointRequest{})
	failsFull(t, "checkpoint", err)
	notFrozen("checkpoint")
	if got := d.checkpointIDs(id); strings.Join(got, ",") != strings.Join(before, ",") {
		t.Fatalf("failed checkpoint left checkpoints %v, want %v", got, before)
	}
	big := strings.Repeat("x", 64<<10) // larger than what is left of the last page of any file
	_, err = c.StatePatch(ctx, id, []byte(`[{"op":"add","path":"/lost","value":"`+big+`"}]`), -1)
	failsFull(t, "state patch", err)
	if s := d.stateDoc(id); s != `{"v":"good"}` {
		t.Fatalf("failed state patch: state %.100s", s)
	}
	out, _, _ := d.cliRaw("exec", id, "--", "curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "--data-binary", "@/root/big", u.plain.URL+"/unjournaled")
	if out != "507" || d.effectStatus(id, u.plain.URL+"/unjournaled") != "none" {
		t.Fatalf("POST answered %s (want 507 Insufficient Storage), effect %s, though its journal record could not be written", out, d.effectStatus(id, u.plain.URL+"/unjournaled"))
	}
	_, err = c.Rollback(ctx, id, api.RollbackRequest{To: good.ID})
	// The intent record has its place on disk: the rollback starts, fails at its first write
	// and stays pending (effects dropped, files restored), to be finished first by the next
	// checkpoint, rollback or commit; meanwhile state patches are refused.
	failsFull(t, "rollback", err)
	if !strings.Contains(err.Error(), "pending") {
		t.Fatalf("failed rollback does not say it is pending: %v", err)
	}
	file = "good\n"
	notFrozen("rollback")
	if st := d.effectStatus(id, u.plain.URL+"/dirty"); st != "dropped" || d.stateDoc(id) != `{"v":"good"}` || len(d.checkpointIDs(id)) != len(before) {
		t.Fatalf("pending rollback: effect %s, state %s, checkpoints %v", st, d.stateDoc(id), d.checkpointIDs(id))
	}
	if _, errOut, code := d.cliRaw("state", "patch", id, `[{"op":"add","path":"/v","value":"torn"}]`); code == 0 || !strings.Contains(errOut, "pending rollback") {
		t.Fatalf("state patch during a pending rollback: exit %d, %q", code, errOut)
	}
	// The failed operations above may have freed a few pages (a staged file, a record they
	// removed): the disk is topped up, or the commit's redo of the pending rollback could
	// find room and go on to send.
	topUp(t, d.root)
	_, err = c.Commit(ctx, id)
	failsFull(t, "commit", err)
	var cks []api.Checkpoint
	d.cliJSON(&cks, "checkpoint", "ls", id)
	if u.count("POST /good") != 0 || d.effectStatus(id, u.plain.URL+"/good") != "held" || cks[len(cks)-1].Committed {
		t.Fatalf("failed commit: upstream saw /good %d times, effect %s, commit point moved %v",
			u.count("POST /good"), d.effectStatus(id, u.plain.URL+"/good"), cks[len(cks)-1].Committed)
	}
	_, err = c.SnapshotPush(ctx, id, "", nil)
	failsFull(t, "snapshot push", err)
	notFrozen("push")

	free()
	var cm api.CommitResult
	d.cliJSON(&cm, "commit", id) // finishes the pending rollback, then commits
	if out := d.cli("exec", id, "--", "cat", "/root/f"); out != "good\n" || d.stateDoc(id) != `{"v":"good"}` || cm.Checkpoint != good.ID {
		t.Fatalf("after freeing space: commit %+v, file %q, state %s; want the good checkpoint's", cm, out, d.stateDoc(id))
	}
	if g, b, n := u.count("POST /good"), u.count("POST /dirty"), u.count("POST /unjournaled"); g != 1 || b != 0 || n != 0 {
		t.Fatalf("upstream saw /good %d, /dirty %d, /unjournaled %d times; want 1, 0, 0", g, b, n)
	}
	d.cli("state", "patch", id, `[{"op":"add","path":"/v","value":"again"}]`) // the write paths work again
	d.cli("checkpoint", "create", id)
	d.cli("snapshot", "push", id)

	// A release mostly deletes: on a full disk it succeeds, and leaves nothing of the session.
	d.holdPost(id, u.plain.URL+"/released")
	refill := fill(t, d.root)
	t.Cleanup(refill)
	if err := c.Release(ctx, id); err != nil {
		t.Fatalf("release on a full state root: %v", err)
	}
	refill()
	for _, p := range []string{filepath.Join(d.root, "sandboxes", id), filepath.Join(d.root, "proxy", "journal", id+".journal")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("release on a full disk left %s (%v)", p, err)
		}
	}
	if n := u.count("POST /released"); n != 0 {
		t.Errorf("held effect of the released sandbox sent %d times", n)
	}
}
