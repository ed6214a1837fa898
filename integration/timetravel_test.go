package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestTimeTravelMCTS is the tree-search pattern: from checkpoint C try action A, go back to
// C, try action B, then go back to A's result (another branch) and continue from it. After
// each move the files (full walk), the state document and the held effects are the target's;
// effects held on a branch the sandbox left were dropped and stay dropped.
func TestTimeTravelMCTS(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	type point struct{ tree, state string }
	at := map[string]point{}
	take := func(name string) string {
		var ck api.Checkpoint
		d.cliJSON(&ck, "checkpoint", "create", id, "--name", name)
		at[name] = point{d.tree(id), d.stateDoc(id)}
		return ck.ID
	}
	check := func(name string, held map[string]string) {
		t.Helper()
		if got := d.tree(id); got != at[name].tree {
			t.Fatalf("files after the move to %s differ:\n%s", name, lineDiff(at[name].tree, got))
		}
		if got := d.stateDoc(id); got != at[name].state {
			t.Fatalf("state after the move to %s: %s, want %s", name, got, at[name].state)
		}
		for path, want := range held {
			if got := d.effectStatus(id, u.plain.URL+path); got != want {
				t.Fatalf("after the move to %s: effect %s is %s, want %s", name, path, got, want)
			}
		}
	}
	act := func(name string) {
		d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo "+name+" > /w/"+name+" && rm -f /w/shared && echo "+name+" > /w/shared")
		d.cli("state", "patch", id, `[{"op":"add","path":"/tried","value":"`+name+`"},{"op":"append","path":"/log","value":"`+name+`"}]`)
		d.holdPost(id, u.plain.URL+"/"+name)
	}
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo base > /w/shared")
	d.cli("state", "patch", id, `[{"op":"add","path":"/log","value":[]}]`)
	d.holdPost(id, u.plain.URL+"/before-c")
	c := take("C")
	act("a")
	a := take("A")
	d.cli("goto", id, "C")
	check("C", map[string]string{"/before-c": "held", "/a": "dropped"})
	act("b")
	b := take("B")
	d.cli("rollback", id, "--to", "A") // across: B -> C -> A
	check("A", map[string]string{"/before-c": "held", "/a": "dropped", "/b": "dropped"})
	act("a2") // continue from A's result
	a2 := take("A2")
	var list []api.Checkpoint
	d.cliJSON(&list, "checkpoint", "ls", id)
	parent := map[string]string{}
	for _, ck := range list {
		parent[ck.ID] = ck.Parent
	}
	if parent[a] != c || parent[b] != c || parent[a2] != a {
		t.Fatalf("parent links %v: want %s and %s under %s, %s under %s", parent, a, b, c, a2, a)
	}
	if out := d.cli("checkpoint", "ls", id, "--tree"); !strings.Contains(out, "(A2)") || !strings.Contains(out, "@") {
		t.Fatalf("tree drawing:\n%s", out)
	}
	d.cli("goto", id, "B")
	check("B", map[string]string{"/before-c": "held", "/b": "dropped", "/a2": "dropped"})
	d.cli("goto", id, "@~1") // C
	check("C", nil)
	d.cli("commit", id)
	if n := u.count("POST /before-c"); n != 1 {
		t.Fatalf("the effect held before C was sent %d times", n)
	}
	for _, p := range []string{"/a", "/b", "/a2"} {
		if n := u.count("POST " + p); n != 0 {
			t.Fatalf("effect %s of an abandoned branch reached the upstream %d times", p, n)
		}
	}
	// Bad references: unknown not_found, ambiguous invalid_argument; the commit rule holds
	// across branches.
	cl, ctx := d.client(), context.Background()
	for ref, check := range map[string]func(error) bool{"nope": errdefs.IsNotFound, "@~99": errdefs.IsNotFound, "@~x": errdefs.IsInvalidArgument} {
		if _, err := cl.Rollback(ctx, id, api.RollbackRequest{To: ref}); !check(err) {
			t.Errorf("rollback to %q: %v", ref, err)
		}
	}
	for _, behind := range []string{"lease", "C"} {
		if _, err := cl.Rollback(ctx, id, api.RollbackRequest{To: behind}); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("move to %s, not below the commit point C: %v, want failed_precondition", behind, err)
		}
	}
	d.cli("goto", id, "A") // below the commit point: allowed
	check("A", map[string]string{"/a": "dropped", "/before-c": "released"})
	take("dup")
	take("dup")
	if _, err := cl.Rollback(ctx, id, api.RollbackRequest{To: "dup"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("rollback to an ambiguous name: %v, want invalid_argument", err)
	}
	if _, err := cl.InspectCheckpoint(ctx, id, "lease"); err != nil {
		t.Errorf("inspect lease: %v", err)
	}
}

// TestTimeTravelLookWithoutMoving: the step record and storyboard (log), a file and the
// state as of a checkpoint (show, state get --at), without moving the sandbox; show never
// follows a symlink the sandbox made; a lease labelled deltabox.steps=off records no steps.
func TestTimeTravelLookWithoutMoving(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo one > /w/f")
	d.cli("state", "patch", id, `[{"op":"add","path":"/at","value":"one"}]`)
	d.cli("checkpoint", "create", id, "--name", "one")
	if _, _, code := d.cliRaw("exec", id, "--", "sh", "-c", "echo two > /w/f; echo oops >&2; ln -s /etc /w/link; "+
		"mkdir -p /w/__pycache__ && echo x > /w/__pycache__/m.pyc && printf 'a\\000b' > /w/bin.dat; exit 3"); code == 0 {
		t.Fatal("exec exit 3 not passed on")
	}
	d.cli("state", "patch", id, `[{"op":"replace","path":"/at","value":"two"}]`)
	d.cli("checkpoint", "create", id, "--name", "two")
	for ref, want := range map[string]string{"one:/w/f": "one\n", "two:/w/f": "two\n", "@:w/f": "two\n", "@~1:/w/f": "one\n"} {
		if got := d.cli("show", id, ref); got != want {
			t.Errorf("show %s: %q, want %q", ref, got, want)
		}
	}
	if got := d.cli("show", id, "lease:/etc/passwd"); !strings.Contains(got, "root:") {
		t.Errorf("show of a lower-layer file: %q", got)
	}
	cl, ctx := d.client(), context.Background()
	var sink strings.Builder
	for _, p := range []string{"/w/link/passwd", "/w/missing", "/../../etc/shadow"} {
		if _, err := cl.ShowFile(ctx, id, "two", p, &sink); !errdefs.IsNotFound(err) {
			t.Errorf("show two:%s: %v, want not_found (never through a symlink, never outside the tree)", p, err)
		}
	}
	if _, err := cl.ShowFile(ctx, id, "nope", "/w/f", &sink); !errdefs.IsNotFound(err) {
		t.Errorf("show from an unknown checkpoint: %v", err)
	}
	if got := d.cli("state", "get", id, "/at", "--at", "one"); strings.TrimSpace(got) != `"one"` {
		t.Errorf("state get --at one: %q", got)
	}
	if d.stateDoc(id) != `{"at":"two"}` || d.checkpointHead(id) != "3" {
		t.Fatalf("looking moved the sandbox: state %s head %s", d.stateDoc(id), d.checkpointHead(id))
	}
	// diff -p: unified diffs for text, size and digest for binary, default ignores, paths, stat.
	patch := d.cli("diff", id, "one", "two", "-p")
	for _, want := range []string{"--- a/w/f", "+++ b/w/f", "-one", "+two", "Binary /w/bin.dat: none -> 3 bytes sha256:"} {
		if !strings.Contains(patch, want) {
			t.Errorf("diff -p lacks %q:\n%s", want, patch)
		}
	}
	if strings.Contains(patch, "__pycache__") || !strings.Contains(d.cli("diff", id, "one", "two", "--all"), "__pycache__") {
		t.Errorf("default ignores not applied, or --all not showing everything:\n%s", patch)
	}
	if st := d.cli("diff", id, "one", "two", "--stat", "/w/f"); !strings.Contains(st, "/w/f | +1 -1") || strings.Contains(st, "bin.dat") {
		t.Errorf("diff --stat /w/f:\n%s", st)
	}
	d.cli("exec", id, "--", "sh", "-c", "echo three > /w/f")
	if now := d.cli("diff", id, "two", "-p", "/w/f"); !strings.Contains(now, "+three") {
		t.Errorf("diff two (to now) -p:\n%s", now)
	}
	var sb api.Storyboard
	d.cliJSON(&sb, "log", id)
	if len(sb.Entries) != 3 || sb.Head != "3" {
		t.Fatalf("storyboard: %+v", sb)
	}
	lease, one := sb.Entries[0], sb.Entries[1]
	if len(lease.Steps) != 1 || lease.Steps[0].Argv[2] != "mkdir -p /w && echo one > /w/f" || lease.Steps[0].Exit == nil || lease.Steps[0].Exit.Code != 0 {
		t.Errorf("steps after the lease checkpoint: %+v", lease.Steps)
	}
	if len(one.Steps) != 1 || one.Steps[0].Exit == nil || one.Steps[0].Exit.Code != 3 || one.Steps[0].StderrHead != "oops\n" {
		t.Errorf("steps after checkpoint one: %+v", one.Steps)
	}
	if len(sb.Entries[2].StateOps) != 1 || !strings.Contains(string(sb.Entries[2].StateOps[0].Op), `"two"`) {
		t.Errorf("state ops leading to checkpoint two: %+v", sb.Entries[2].StateOps)
	}
	if out := d.cli("log", id); !strings.Contains(out, "exit 3") || !strings.Contains(out, "! oops") {
		t.Errorf("log:\n%s", out)
	}
	quiet := d.lease("bb", "--label", "deltabox.steps=off").ID
	d.cli("exec", quiet, "--", "true")
	d.cliJSON(&sb, "log", quiet)
	if len(sb.Entries) != 1 || len(sb.Entries[0].Steps) != 0 {
		t.Errorf("steps recorded with deltabox.steps=off: %+v", sb.Entries)
	}
}

// TestTimeTravelForkFrom forks from a checkpoint that is not the head, on this node without a
// snapshot: each fork has the checkpoint's files and state, a new identity and seed, and the
// forked_from label; the source does not move; another sandbox's checkpoint is refused.
func TestTimeTravelForkFrom(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 2)
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w/d && echo base > /w/d/f && ln -s /etc /w/link && rm /etc/group")
	d.cli("state", "patch", id, `[{"op":"add","path":"/v","value":"base"}]`)
	d.cli("checkpoint", "create", id, "--name", "base")
	d.cli("exec", id, "--", "sh", "-c", "echo later > /w/d/f && echo more > /w/more")
	d.cli("state", "patch", id, `[{"op":"replace","path":"/v","value":"later"}]`)
	d.cli("checkpoint", "create", id)
	leases, err := d.client().ForkWith(context.Background(), id, api.SnapshotRequest{Count: 2, From: "base"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 2 {
		t.Fatalf("forks: %+v", leases)
	}
	seeds := map[string]bool{}
	for _, l := range leases {
		if l.ID == id || l.ForkedFrom != id+"@2" {
			t.Errorf("fork %+v: want a new sandbox labelled forked_from %s@2", l, id)
		}
		out := d.cli("exec", l.ID, "--", "sh", "-c", "cat /w/d/f; readlink /w/link; [ -e /w/more ] && echo more; [ -e /etc/group ] && echo group; stat -c %u:%g /w/d/f /etc/passwd; echo $DELTABOX_SEED")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 5 || lines[0] != "base" || lines[1] != "/etc" || lines[2] != "0:0" || lines[3] != "0:0" || lines[4] == "" {
			t.Errorf("fork %s files/seed: %q", l.ID, out)
		}
		seeds[lines[len(lines)-1]] = true
		if got := d.stateDoc(l.ID); got != `{"v":"base"}` {
			t.Errorf("fork %s state %s", l.ID, got)
		}
	}
	if len(seeds) != 2 {
		t.Errorf("forks share a seed: %v", seeds)
	}
	if d.stateDoc(id) != `{"v":"later"}` || d.checkpointHead(id) != "3" {
		t.Errorf("the source moved: state %s head %s", d.stateDoc(id), d.checkpointHead(id))
	}
	cl, ctx := d.client(), context.Background()
	other := leases[0].ID
	if _, err := cl.ForkWith(ctx, id, api.SnapshotRequest{Count: 1, From: other + "@1"}, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("fork from another sandbox's checkpoint: %v, want invalid_argument", err)
	}
	if _, err := cl.ForkWith(ctx, id, api.SnapshotRequest{Count: 1, From: "nope"}, nil); !errdefs.IsNotFound(err) {
		t.Errorf("fork from an unknown checkpoint: %v, want not_found", err)
	}
}

// TestTimeTravelRandomEffects moves a sandbox behind the real egress proxy to random
// checkpoints anywhere in its tree, holding requests between checkpoints: after each move the
// journal holds exactly the target's held effects less those dropped when their branch was
// left (docs/time-travel.md), and the state document is the target's.
func TestTimeTravelRandomEffects(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	rng := rand.New(rand.NewPCG(15, 3))
	type point struct {
		state string
		held  map[string]bool
		wm    int // effects recorded before it
	}
	head := d.checkpointHead(id)
	at := map[string]point{head: {d.stateDoc(id), map[string]bool{}, 0}}
	parent := map[string]string{}
	ids := []string{head}
	var effects []string
	held, dropped := map[string]bool{}, map[string]bool{}
	lca := func(a, b string) string {
		onA := map[string]bool{}
		for c := a; c != ""; c = parent[c] {
			onA[c] = true
		}
		for c := b; c != ""; c = parent[c] {
			if onA[c] {
				return c
			}
		}
		return ""
	}
	moves := 0
	for step := 0; step < 40; step++ {
		switch r := rng.IntN(10); {
		case r < 4:
			path := fmt.Sprintf("/e%d", len(effects))
			d.holdPost(id, u.plain.URL+path)
			effects = append(effects, path)
			held[path] = true
			d.cli("state", "patch", id, fmt.Sprintf(`[{"op":"add","path":"/last","value":%q}]`, path))
		case r < 7:
			var ck api.Checkpoint
			d.cliJSON(&ck, "checkpoint", "create", id)
			parent[ck.ID], head = head, ck.ID
			ids = append(ids, ck.ID)
			at[ck.ID] = point{d.stateDoc(id), copyKeys(held), len(effects)}
		default:
			to := ids[rng.IntN(len(ids))]
			for _, p := range effects[at[lca(head, to)].wm:] {
				if held[p] {
					delete(held, p)
					dropped[p] = true
				}
			}
			d.cli("goto", id, to)
			head = to
			moves++
			if got := d.stateDoc(id); got != at[to].state {
				t.Fatalf("step %d: state after the move to %s: %s, want %s", step, to, got, at[to].state)
			}
			want := map[string]bool{}
			for p := range at[to].held {
				if !dropped[p] {
					want[p] = true
				}
			}
			var list []api.Effect
			d.cliJSON(&list, "effects", "ls", id, "--status", "held")
			got := map[string]bool{}
			for _, e := range list {
				got[strings.TrimPrefix(e.URL, u.plain.URL)] = true
			}
			if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(held) != fmt.Sprint(want) {
				t.Fatalf("step %d: held after the move to %s: %v, want %v (model %v)", step, to, got, want, held)
			}
		}
	}
	if moves < 3 {
		t.Fatalf("only %d moves", moves)
	}
}

func copyKeys(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		if v {
			out[k] = true
		}
	}
	return out
}

// replayPolicy records the answers of GET /rec* for replay.
const replayPolicy = `version: 1
default: deny
rules:
  - host: 127.0.0.1
    methods: [GET]
    path_prefix: /rec
    action: pass
    record: true
  - host: 127.0.0.1
    methods: [GET, HEAD]
    action: pass
`

// TestTimeTravelReplay: a re-run from a checkpoint with --replay, and a fork from it with
// --replay, get the recorded answer of an identical request; without replay the upstream is
// asked again.
func TestTimeTravelReplay(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 2, "")
	policy := filepath.Join(shortTempDir(t), "replay.yaml")
	if err := os.WriteFile(policy, []byte(replayPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	id := d.lease("net", append([]string{"--egress-policy", policy}, noProxyBypass...)...).ID
	fetch := func(sb string) string {
		return d.cli("exec", sb, "--", "curl", "-sS", "-m", "10", "-D", "-", u.plain.URL+"/rec/world")
	}
	d.cli("checkpoint", "create", id, "--name", "before")
	first := fetch(id)
	if u.count("GET /rec/world") != 1 || strings.Contains(first, "X-Deltabox-Replayed") {
		t.Fatalf("first run: upstream saw %d, answer %q", u.count("GET /rec/world"), first)
	}
	d.cli("rollback", id, "--to", "before", "--replay")
	if again := fetch(id); !strings.Contains(again, "X-Deltabox-Replayed: 1") || u.count("GET /rec/world") != 1 {
		t.Fatalf("re-run with replay: upstream saw %d, answer %q", u.count("GET /rec/world"), again)
	}
	leases, err := d.client().ForkWith(context.Background(), id, api.SnapshotRequest{Count: 1, From: "before", Replay: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if forked := fetch(leases[0].ID); !strings.Contains(forked, "X-Deltabox-Replayed: 1") || u.count("GET /rec/world") != 1 {
		t.Fatalf("fork with replay: upstream saw %d, answer %q", u.count("GET /rec/world"), forked)
	}
	d.cli("goto", id, "before")
	if fresh := fetch(id); strings.Contains(fresh, "X-Deltabox-Replayed") || u.count("GET /rec/world") != 2 {
		t.Fatalf("re-run without replay: upstream saw %d, answer %q", u.count("GET /rec/world"), fresh)
	}
}

// TestTimeTravelForkFromL3 forks from an L3 checkpoint that is not the head: the forks' CRIU
// restored processes continue from the checkpoint (the counter), with its files and state, in
// new sandboxes; the source does not move.
func TestTimeTravelForkFromL3(t *testing.T) {
	d := startDaemon(t)
	id := startCounter(d)
	before := d.count(id)
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--level", "l3", "--name", "proc")
	after := d.count(id)
	d.cli("exec", id, "--", "sh", "-c", "rm /root/notes")
	d.cli("checkpoint", "create", id)
	leases, err := d.client().ForkWith(context.Background(), id, api.SnapshotRequest{Count: 1, From: "proc"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || leases[0].ID == id || leases[0].ForkedFrom != id+"@"+ck.ID {
		t.Fatalf("forks %+v", leases)
	}
	checkContinues(t, d, leases[0].ID, before, after+restoreSlack)
	if _, _, code := d.cliRaw("exec", id, "--", "test", "-e", "/root/notes"); code == 0 {
		t.Fatal("the source moved")
	}
}
