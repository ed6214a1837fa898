package integration

import (
	"context"
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
