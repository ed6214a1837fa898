package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// treeScript prints one line per path of the sandbox's tree (type, mode, owner, size, link
// target) and a checksum of every regular file: a full walk to compare states with.
// treeScript prints one line per path of the sandbox's tree (type, mode, owner, size and link
// count of non-directories, symlink targets) and a checksum of every regular file: a full walk
// to compare states with. It batches stat and md5sum through xargs to stay fast.
const treeScript = `cd / && P='( -path ./proc -o -path ./sys -o -path ./dev -o -path ./.deltabox ) -prune -o'
find . -xdev $P -type d -print0 | xargs -0 stat -c '%n %F %a %u:%g' | sort
find . -xdev $P ! -type d -print0 | xargs -0 stat -c '%n %F %a %u:%g %s %h %N' | sort
find . -xdev $P -type f -print0 | xargs -0 md5sum | sort`

func (d *daemon) tree(id string) string {
	d.t.Helper()
	out := d.cli("exec", id, "--", "sh", "-c", treeScript)
	if !strings.Contains(out, "./etc/passwd regular file") || !strings.Contains(out, "  ./etc/passwd") {
		d.t.Fatalf("tree walk looks wrong (no stat and checksum line for /etc/passwd):\n%.2000s", out)
	}
	return out
}

// envInt returns the positive integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func (d *daemon) stateDoc(id string) string {
	d.t.Helper()
	var v any
	d.cliJSON(&v, "state", "get", id)
	data, _ := json.Marshal(v)
	return string(data)
}

func TestStepCheckpointRollback(t *testing.T) {
	d := startDaemon(t)
	stepCheckpointRollback(t, d)
	if !strings.Contains(d.logs.String(), "walked=false") {
		t.Errorf("no capture used the change tracker")
	}
}

// TestStepCheckpointRollbackWalking is the same step with the change tracker off: every
// capture walks the upper dir.
func TestStepCheckpointRollbackWalking(t *testing.T) {
	d := startDaemonWith(t, "[checkpoints]\ntrack_changes = false\n")
	stepCheckpointRollback(t, d)
	if logs := d.logs.String(); strings.Contains(logs, "walked=false") || !strings.Contains(logs, "walked=true") {
		t.Errorf("with track_changes = false some capture did not walk the upper dir")
	}
}

func stepCheckpointRollback(t *testing.T, d *daemon) {
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /work && echo draft > /work/notes.txt && echo keep > /work/keep.txt")
	d.cli("state", "patch", id, `[{"op":"add","path":"/conversation","value":[]},{"op":"append","path":"/conversation","value":{"role":"user","text":"hi"}}]`)
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "-m", "step 1")
	if ck.ID == "" || ck.Level != "l1" || ck.Parent == "" || ck.FilesChanged == 0 {
		t.Fatalf("unexpected checkpoint: %+v", ck)
	}
	before, beforeState := d.tree(id), d.stateDoc(id)

	// A failing step: files written, deleted and changed (also image files), state appended,
	// a background process started.
	d.cli("exec", id, "--", "sh", "-c", `echo broken > /work/notes.txt; rm /work/keep.txt; echo new > /work/new.txt;
		rm /etc/os-release; chmod 600 /etc/passwd; ln -s /etc/shadow /work/link; mkdir -p /tmp/x/y; nohup sleep 1000 >/dev/null 2>&1 &`)
	d.cli("state", "patch", id, `[{"op":"append","path":"/conversation","value":{"role":"tool","text":"error"}},{"op":"add","path":"/plan","value":"retry"}]`)
	var diff api.Diff
	d.cliJSON(&diff, "diff", id)
	if len(diff.Files) < 5 || len(diff.State) != 2 {
		t.Errorf("diff should list the step's files and 2 state ops: %+v", diff)
	}
	var rb api.RollbackResult
	d.cliJSON(&rb, "rollback", id)
	if rb.To != ck.ID || rb.FilesRestored == 0 || rb.OpsUndone != 2 || rb.ProcessesStopped < 1 {
		t.Errorf("unexpected rollback result: %+v", rb)
	}
	if after := d.tree(id); after != before {
		t.Errorf("tree after rollback differs:\n%s", lineDiff(before, after))
	}
	if got := d.stateDoc(id); got != beforeState {
		t.Errorf("state after rollback: %s, want %s", got, beforeState)
	}
	if out := d.cli("exec", id, "--", "sh", "-c", "ps -eo args | grep 'sleep 1000' | grep -v grep || true"); strings.Contains(out, "sleep") {
		t.Errorf("process started after the checkpoint survived the rollback: %s", out)
	}
	var cks []api.Checkpoint
	d.cliJSON(&cks, "checkpoint", "ls", id)
	if len(cks) != 2 || cks[1].ID != ck.ID {
		t.Errorf("checkpoints after rollback: %+v", cks)
	}
	d.cli("verify", id) // state log and a full walk of the tree match the checkpoint
	d.cli("exec", id, "--", "sh", "-c", "echo tampered > /work/keep.txt")
	var v api.VerifyResult
	out, _, code := d.cliRaw("-o", "json", "verify", id)
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != 1 || v.OK || len(v.Problems) != 1 || !strings.Contains(v.Problems[0], "work/keep.txt") {
		t.Errorf("verify after a change: exit %d, %+v", code, v)
	}
}

func TestCheckpointBadInput(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	c, ctx := d.client(), context.Background()
	d.cli("state", "patch", id, `[{"op":"add","path":"/a","value":1}]`)
	for _, bad := range []string{`[{"op":"add","path":"nope","value":1}]`, `[{"op":"frobnicate","path":"/a"}]`,
		`[{"op":"replace","path":"/a","value":2},{"op":"remove","path":"/missing"}]`, `not json`} {
		if _, err := c.StatePatch(ctx, id, []byte(bad), -1); !errdefs.IsInvalidArgument(err) {
			t.Errorf("patch %s: want invalid_argument, got %v", bad, err)
		}
	}
	if doc := d.stateDoc(id); doc != `{"a":1}` {
		t.Errorf("document changed by failed patches: %s", doc)
	}
	if _, err := c.StatePatch(ctx, id, []byte(`[{"op":"replace","path":"/a","value":3}]`), 0); !errdefs.IsConflict(err) {
		t.Errorf("stale --if-seq: want conflict, got %v", err)
	}
	if _, err := c.Rollback(ctx, id, api.RollbackRequest{To: "999"}); !errdefs.IsNotFound(err) {
		t.Errorf("rollback to unknown checkpoint: want not_found, got %v", err)
	}
	if _, err := c.Checkpoint(ctx, id, api.CheckpointRequest{Level: "l9"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("level l9: want invalid_argument, got %v", err)
	}
	if _, err := c.Checkpoint(ctx, "sb-nope", api.CheckpointRequest{}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown sandbox: want not_found, got %v", err)
	}
}

func TestCommitPointBlocksRollback(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	var first api.Checkpoint
	d.cliJSON(&first, "checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo done > /root/step")
	d.cli("commit", id)
	_, errOut, code := d.cliRaw("rollback", id, "--to", first.ID)
	if code != 1 || !strings.Contains(errOut, "commit") {
		t.Fatalf("rollback behind a commit: exit %d, %q", code, errOut)
	}
	d.cli("checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo more > /root/step2")
	d.cli("rollback", id) // to the checkpoint after the commit: allowed
	d.cli("rollback", id, "--to", first.ID, "--force")
	if out, _, code := d.cliRaw("exec", id, "--", "cat", "/root/step"); code == 0 {
		t.Errorf("forced rollback kept /root/step: %q", out)
	}
}

func TestRollbackNeverLeavesTheSandboxRoot(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	hostDir := shortTempDir(t)
	canary := filepath.Join(hostDir, "canary")
	os.WriteFile(canary, []byte("host secret"), 0o644)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(canary, old, old)
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /data && echo mine > /data/canary && echo a > /data/file")
	d.cli("checkpoint", "create", id)
	// The sandbox swaps its directory for a symlink to the host directory.
	d.cli("exec", id, "--", "sh", "-c", fmt.Sprintf("rm -rf /data && ln -s %s /data", hostDir))
	d.cli("checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo changed > /data/canary 2>/dev/null; true")
	d.cli("rollback", id, "--to", "2")
	if out := d.cli("exec", id, "--", "cat", "/data/canary", "/data/file"); out != "mine\na\n" {
		t.Errorf("directory not restored: %q", out)
	}
	data, _ := os.ReadFile(canary)
	st, _ := os.Stat(canary)
	if string(data) != "host secret" || !st.ModTime().Equal(old) {
		t.Fatalf("host canary touched: %q %v", data, st.ModTime())
	}
}

// TestCrashDuringCheckpoint kills the daemon at each phase of a checkpoint (failpoints):
// frozen, captured, thawed before the record is durable, and after. The sandbox always comes
// back running with its content; the checkpoint exists exactly when its record was durable.
func TestCrashDuringCheckpoint(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	for _, c := range []struct {
		point string
		kept  bool
	}{
		{"checkpoint/frozen", false},
		{"checkpoint/captured", false},
		{"checkpoint/before-commit", false},
		{"checkpoint/committed", true},
	} {
		t.Run(strings.ReplaceAll(c.point, "/", "-"), func(t *testing.T) {
			d.t = t
			d.cli("exec", id, "--", "sh", "-c", "echo before > /root/v")
			var good api.Checkpoint
			d.cliJSON(&good, "checkpoint", "create", id)
			d.cli("exec", id, "--", "sh", "-c", "echo after > /root/v; mkdir -p /bulk; echo x > /bulk/f")
			before := d.checkpointIDs(id)
			d.crashAt(c.point, "checkpoint", "create", id)
			if out := d.cli("exec", id, "--timeout", "10s", "--", "cat", "/root/v"); out != "after\n" {
				t.Fatalf("sandbox content after the crash: %q", out)
			}
			after := d.checkpointIDs(id)
			if got := len(after) - len(before); (got == 1) != c.kept || got > 1 || got < 0 {
				t.Fatalf("checkpoints %v before the crash, %v after; want the new one kept: %v", before, after, c.kept)
			}
			if c.kept {
				d.cli("exec", id, "--", "sh", "-c", "echo later > /root/v")
				d.cli("rollback", id, "--to", after[len(after)-1])
				if out := d.cli("exec", id, "--", "cat", "/root/v"); out != "after\n" {
					t.Fatalf("rollback to the checkpoint taken at the crash: %q", out)
				}
			}
			d.cli("rollback", id, "--to", good.ID)
			if out := d.cli("exec", id, "--", "sh", "-c", "cat /root/v; ls /bulk 2>/dev/null | wc -l"); out != "before\n0\n" {
				t.Fatalf("after rollback to the pre-crash checkpoint: %q", out)
			}
		})
	}
	d.t = t
}

func TestSandboxUsesItsOwnSocket(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	script := `
import http.client, json, socket
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect("/.deltabox/run/api.sock")
def call(method, path, body=None):
    c = C("localhost")
    c.request(method, path, body=json.dumps(body) if body is not None else None)
    r = c.getresponse()
    return r.status, json.loads(r.read())
print(call("POST", "/v1/self/state", [{"op": "add", "path": "/memo", "value": "saved from inside"}])[0])
print(call("POST", "/v1/self/checkpoints", {"message": "inside"})[1]["message"])
print(call("GET", "/v1/self/state")[1]["memo"])
print(call("POST", "/v1/self/commit")[0])
print(call("POST", "/v1/self/rollback", {"to": "1", "force": True})[0])
`
	out := d.cli("exec", id, "--", "python3", "-c", script)
	if out != "200\ninside\nsaved from inside\n404\n412\n" {
		t.Fatalf("in-sandbox API: %q", out)
	}
	var cks []api.Checkpoint
	d.cliJSON(&cks, "checkpoint", "ls", id)
	if cks[len(cks)-1].Message != "inside" {
		t.Errorf("checkpoint from inside not listed: %+v", cks)
	}
}

// TestRandomizedRollback drives random file operations and state patches through the CLI,
// checkpoints at random points and rolls back to random earlier ones; every time the full tree
// and the state document must equal what they were at that checkpoint.
func TestRandomizedRollback(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	// Seed 8 chmods the sandbox's root through a symlink to "/". DELTABOX_RANDOM_SEED and
	// DELTABOX_RANDOM_OPS run it differently or longer.
	seeds, ops := []int{42, 8}, envInt("DELTABOX_RANDOM_OPS", 300)
	if s := envInt("DELTABOX_RANDOM_SEED", 0); s > 0 {
		seeds = []int{s}
	}
	if testing.Short() {
		seeds, ops = seeds[:1], 60
	}
	for _, seed := range seeds {
		randomizedRollback(t, d, seed, ops)
	}
}

// randomizedRollback runs ops random file operations and state patches in a new lease, takes
// checkpoints and rolls back to random ones anywhere in the checkpoint tree (other branches
// included: a rollback deletes nothing), comparing full walks of the files and the state
// document with those taken at the checkpoint.
func randomizedRollback(t *testing.T, d *daemon, seed, ops int) {
	id := d.lease("bb").ID
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(len(id))))
	type snap struct{ id, tree, state string }
	var snaps []snap
	take := func() {
		var ck api.Checkpoint
		d.cliJSON(&ck, "checkpoint", "create", id)
		snaps = append(snaps, snap{ck.ID, d.tree(id), d.stateDoc(id)})
	}
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w/a /w/b && echo seed > /w/a/f0")
	take()
	for i := 0; i < ops; i += 5 {
		script := ""
		for j := 0; j < 5; j++ {
			script += randomFileOp(rng, i+j) + "\n"
		}
		d.cli("exec", id, "--", "sh", "-c", script+"true")
		d.cli("state", "patch", id, randomPatch(rng, i))
		switch r := rng.IntN(10); {
		case r < 4:
			take()
		case r < 6 && len(snaps) > 1:
			k := rng.IntN(len(snaps))
			d.cli("rollback", id, "--to", snaps[k].id)
			if got := d.tree(id); got != snaps[k].tree {
				t.Fatalf("seed %d, op %d: tree after rollback to %s differs:\n%s", seed, i, snaps[k].id, lineDiff(snaps[k].tree, got))
			}
			if got := d.stateDoc(id); got != snaps[k].state {
				t.Fatalf("seed %d, op %d: state after rollback to %s: %s, want %s", seed, i, snaps[k].id, got, snaps[k].state)
			}
		}
	}
	var list []api.Checkpoint
	d.cliJSON(&list, "checkpoint", "ls", id)
	if len(list) < len(snaps) {
		t.Fatalf("seed %d: %d checkpoints listed, %d taken: a rollback deleted some", seed, len(list), len(snaps))
	}
}

func randomFileOp(rng *rand.Rand, i int) string {
	dirs := []string{"/w/a", "/w/b", "/w/a/sub", "/etc", "/root"}
	dir := dirs[rng.IntN(len(dirs))]
	f := fmt.Sprintf("%s/f%d", dir, rng.IntN(6))
	g := fmt.Sprintf("%s/f%d", dirs[rng.IntN(3)], rng.IntN(6))
	switch rng.IntN(12) {
	case 0:
		return fmt.Sprintf("mkdir -p %s && echo %d > %s", dir, i, f)
	case 1:
		return fmt.Sprintf("[ -d %s ] && echo more%d >> %s", dir, i, f)
	case 2:
		return fmt.Sprintf("[ -f %s ] && truncate -s %d %s", f, rng.IntN(100), f)
	case 3:
		return fmt.Sprintf("[ -e %s ] && chmod %o %s", f, []int{0o600, 0o644, 0o755}[rng.IntN(3)], f)
	case 4:
		return fmt.Sprintf("[ -e %s ] && chown %d:%d %s", f, rng.IntN(3)*1000, rng.IntN(3)*1000, f)
	case 5:
		return fmt.Sprintf("[ -e %s ] && mkdir -p $(dirname %s) && mv %s %s", f, g, f, g)
	case 6:
		return fmt.Sprintf("[ -f %s ] && [ ! -e %s ] && mkdir -p $(dirname %s) && ln %s %s", f, g, g, f, g)
	case 7:
		return fmt.Sprintf("[ ! -e %s ] && mkdir -p %s && ln -s %s %s", g, dir, []string{"/etc/passwd", "../x", "/"}[rng.IntN(3)], g)
	case 8:
		return fmt.Sprintf("mkdir -p %s/d%d", dir, rng.IntN(3))
	case 9:
		return fmt.Sprintf("rmdir %s/d%d 2>/dev/null", dir, rng.IntN(3))
	case 10:
		return fmt.Sprintf("rm -f %s %s", f, []string{"/etc/group", "/etc/hostname", "/bin/true"}[rng.IntN(3)])
	default:
		return fmt.Sprintf("rm -rf %s/d%d", dir, rng.IntN(3))
	}
}

func randomPatch(rng *rand.Rand, i int) string {
	switch rng.IntN(4) {
	case 0:
		return fmt.Sprintf(`[{"op":"add","path":"/k%d","value":{"i":%d}}]`, rng.IntN(5), i)
	case 1:
		return fmt.Sprintf(`[{"op":"append","path":"/log","value":"step %d"}]`, i)
	case 2:
		return fmt.Sprintf(`[{"op":"add","path":"/n","value":%d},{"op":"copy","from":"/n","path":"/m"}]`, i)
	default:
		return `[{"op":"add","path":"/tmp","value":[1,2,3]},{"op":"remove","path":"/tmp/1"}]`
	}
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	in := func(xs []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	wm, gm := in(w), in(g)
	var b strings.Builder
	for _, x := range w {
		if !gm[x] {
			b.WriteString("- " + x + "\n")
		}
	}
	for _, x := range g {
		if !wm[x] {
			b.WriteString("+ " + x + "\n")
		}
	}
	return b.String()
}

func TestLongL1ChainGetsAnL2(t *testing.T) {
	d := startDaemonWith(t, "[checkpoints]\nl2_every = 3\n")
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	var levels []string
	for i := 0; i < 5; i++ {
		d.cli("exec", id, "--", "sh", "-c", fmt.Sprintf("echo %d > /root/f%d", i, i))
		var ck api.Checkpoint
		d.cliJSON(&ck, "checkpoint", "create", id)
		levels = append(levels, ck.Level)
	}
	if strings.Join(levels, " ") != "l1 l1 l1 l2 l1" {
		t.Fatalf("levels of 5 default checkpoints with l2_every = 3: %v", levels)
	}
	d.cli("rollback", id, "--to", "2")
	if out := d.cli("exec", id, "--", "sh", "-c", "cat /root/f*"); out != "0\n" {
		t.Fatalf("rollback across the automatic L2: %q", out)
	}
	// The automatic L2 is cut as a delta and made full after the answer (the daemon says
	// so); it restores, also after a restart.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.logs.String(), "automatic l2 compacted") {
		if time.Now().After(deadline) {
			t.Fatal("the automatic l2 was never compacted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, restart := range []bool{false, true} {
		if restart {
			d.kill()
			d.start()
		}
		d.cli("rollback", id, "--to", "5")
		if out := d.cli("exec", id, "--", "sh", "-c", "cat /root/f*"); out != "0\n1\n2\n3\n" {
			t.Fatalf("rollback to the compacted L2 (restart %v): %q", restart, out)
		}
	}
}

// TestWriteThroughMappingIsCaptured: a process writes through a shared writable mmap, which
// raises no file event while the mapping lives; the checkpoint still captures the file (the
// daemon passes the sandbox's open-for-write and mapped files to the capture), and a rollback
// brings its old content back under the live mapping.
func TestWriteThroughMappingIsCaptured(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	const prog = `import mmap, os, time
f = open("/work/m.bin", "r+b")
m = mmap.mmap(f.fileno(), 4096)
f.close()
while not os.path.exists("/work/go"): time.sleep(0.01)
m[0:5] = b"hello"
open("/work/done", "w").close()
time.sleep(1000)`
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /work && head -c 4096 /dev/zero > /work/m.bin && cat > /work/p.py <<'EOF'\n"+prog+"\nEOF\nnohup python3 /work/p.py >/dev/null 2>&1 &")
	var ck1, ck2 api.Checkpoint
	d.cliJSON(&ck1, "checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "touch /work/go; i=0; while [ ! -e /work/done ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; test -e /work/done")
	d.cliJSON(&ck2, "checkpoint", "create", id)
	var diff api.Diff
	d.cliJSON(&diff, "diff", id, "--from", ck1.ID, "--to", ck2.ID)
	found := false
	for _, f := range diff.Files {
		found = found || strings.TrimPrefix(f.Path, "/") == "work/m.bin"
	}
	if !found {
		t.Fatalf("checkpoint %s missed the write through the mapping; diff: %+v", ck2.ID, diff.Files)
	}
	d.cliJSON(new(api.RollbackResult), "rollback", id, "--to", ck1.ID)
	if out := d.cli("exec", id, "--", "sh", "-c", "head -c 5 /work/m.bin | od -An -c | tr -d ' \\n'"); out != `\0\0\0\0\0` {
		t.Fatalf("after rollback the mapped file starts with %q, want zeros", out)
	}
}

// TestRetentionKeepsLeaseCheckpoint: past the retention limit the first checkpoint (the
// sandbox as leased) is kept and can still be rolled back to, agent state included (the
// state log used to be compacted past it: "log from 0: compacted up to 8").
func TestRetentionKeepsLeaseCheckpoint(t *testing.T) {
	d := startDaemonWith(t, "[checkpoints]\nretain = 3\n")
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	lease := d.stateDoc(id)
	for i := 0; i < 6; i++ {
		d.cli("state", "patch", id, fmt.Sprintf(`[{"op":"add","path":"/n%d","value":%d}]`, i, i))
		d.cli("exec", id, "--", "sh", "-c", fmt.Sprintf("echo %d > /root/n", i))
		d.cli("checkpoint", "create", id)
	}
	ids := d.checkpointIDs(id)
	if len(ids) != 3 || ids[0] != "1" {
		t.Fatalf("checkpoints after retention: %v, want 3 with the first", ids)
	}
	d.cli("rollback", id, "--to", "1")
	if got := d.stateDoc(id); got != lease {
		t.Fatalf("state after rollback to the lease checkpoint: %s, want %s", got, lease)
	}
	if _, _, code := d.cliRaw("exec", id, "--", "test", "-e", "/root/n"); code == 0 {
		t.Fatal("files not rolled back to the lease checkpoint")
	}
}

// TestRetentionFoldsABigCheckpoint: past the bound, the big checkpoint (1,500 files) is
// folded into its children after the checkpoints' answers (retain.go), the tree holding at
// most the slack more meanwhile; once settled every checkpoint left restores its files, the
// folded-into one the big checkpoint's too, also after a kill -9 and restart.
func TestRetentionFoldsABigCheckpoint(t *testing.T) {
	d := startDaemonWith(t, "[checkpoints]\nretain = 16\n")
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir /root/many && cd /root/many && for i in $(seq 1500); do echo $i > f$i; done")
	d.cli("checkpoint", "create", id)
	for i := range 24 {
		d.cli("exec", id, "--", "sh", "-c", fmt.Sprintf("echo %d > /root/n && echo x%d > /root/many/f%d", i, i, i+1))
		d.cli("checkpoint", "create", id)
		if n := len(d.checkpointIDs(id)); n > 16+2 {
			t.Fatalf("%d checkpoints after checkpoint %d: bound 16, slack 2", n, i)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(d.checkpointIDs(id)) != 16 {
		if time.Now().After(deadline) {
			t.Fatalf("retention never settled: %v", d.checkpointIDs(id))
		}
		time.Sleep(50 * time.Millisecond)
	}
	check := func(ck string) {
		t.Helper()
		var c api.Checkpoint
		d.cliJSON(&c, "checkpoint", "inspect", id, ck)
		d.cli("rollback", id, "--to", ck)
		n, err := strconv.Atoi(strings.TrimSpace(d.cli("exec", id, "--", "cat", "/root/n")))
		if err != nil {
			t.Fatalf("checkpoint %s: /root/n: %v", ck, err)
		}
		want := fmt.Sprintf("%d x%d %d 1500", n, n, n+2)
		got := strings.Join(strings.Fields(d.cli("exec", id, "--", "sh", "-c",
			fmt.Sprintf("cat /root/n /root/many/f%d /root/many/f%d; ls /root/many | wc -l", n+1, n+2))), " ")
		if got != want {
			t.Fatalf("checkpoint %s restores %q, want %q", ck, got, want)
		}
	}
	ids := d.checkpointIDs(id)
	for _, ck := range []string{ids[1], ids[len(ids)-1], ids[1]} {
		check(ck)
	}
	d.kill()
	d.start()
	if got := d.checkpointIDs(id); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("checkpoints after a restart: %v, were %v", got, ids)
	}
	check(ids[2])
	check(ids[1])
}
