package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/state"
)

// treeModel is what the tree test expects: each checkpoint's document and held effects.
type treeModel struct {
	docs    map[string]string          // checkpoint -> document
	held    map[string]map[uint64]bool // checkpoint -> effects held when it was taken
	dropped map[uint64]bool            // effects dropped by leaving their branch: never held again
}

// TestTreeRandomStateAndEffects takes random state patches, held effects, checkpoints,
// rollbacks to any checkpoint of the tree (other branches included), restarts and
// retention, with a real state store: after every rollback the document equals the
// target's, and the journal holds exactly the target's held effects less those dropped
// when their branch was left (docs/time-travel.md).
func TestTreeRandomStateAndEffects(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { treeRandom(t, seed, 400) })
	}
}

func treeRandom(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir(), state.WithSnapshotEvery(50))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := newRigWith(t, 24, st)
	r.o.opts.RetainBranch = 10
	rng := rand.New(rand.NewPCG(seed, 15))
	m := treeModel{docs: map[string]string{}, held: map[string]map[uint64]bool{}, dropped: map[uint64]bool{}}
	m.docs["1"], m.held["1"] = r.doc(), map[uint64]bool{}
	var moves, cross, rebuilt int
	for i := 0; i < steps; i++ {
		switch x := rng.IntN(100); {
		case x < 35:
			r.randomPatch(rng, i)
		case x < 45:
			r.fx.hold()
		case x < 65:
			c, err := r.o.Checkpoint(ctx, "sb", api.CheckpointRequest{Name: fmt.Sprintf("n%d", rng.IntN(4))})
			if err != nil {
				t.Fatal(err)
			}
			m.docs[c.ID], m.held[c.ID] = r.doc(), r.heldNow()
		case x < 93:
			ids := ids(r.s.ckpts)
			to := ids[rng.IntN(len(ids))]
			_, lca, _ := r.s.pathBetween(r.s.head, to)
			if lca != to {
				cross++
			}
			in, err := r.s.rollbackTarget(api.RollbackRequest{To: to})
			if err != nil {
				t.Fatal(err)
			}
			if in.Rebuild {
				rebuilt++
			}
			wm := r.s.ckpts[r.s.find(lca)].EffectsWatermark
			for seq := range r.heldNow() {
				if seq > wm {
					m.dropped[seq] = true
				}
			}
			if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: to}); err != nil {
				t.Fatalf("step %d: rollback to %s: %v", i, to, err)
			}
			moves++
			r.checkAt(i, to, m)
		case x < 96:
			r.reopen()
		default:
			r.fx.hold() // and a patch, both after the head: undone by the next move
			r.randomPatch(rng, i)
		}
		for id := range m.docs { // retention
			if r.s.find(id) < 0 {
				delete(m.docs, id)
			}
		}
	}
	t.Logf("seed %d: %d moves (%d to another branch, %d rebuilt the state), %d checkpoints kept of %d",
		seed, moves, cross, rebuilt, len(r.s.ckpts), r.s.meta.Next-1)
	if cross == 0 || rebuilt == 0 {
		t.Fatal("no move to another branch")
	}
}

// checkAt checks the session against the model after a move to id.
func (r *rig) checkAt(step int, id string, m treeModel) {
	r.t.Helper()
	if got := r.doc(); got != m.docs[id] {
		r.t.Fatalf("step %d: state after the move to %s:\n got %s\nwant %s", step, id, got, m.docs[id])
	}
	want := map[uint64]bool{}
	for seq := range m.held[id] {
		if !m.dropped[seq] {
			want[seq] = true
		}
	}
	if got := r.heldNow(); !maps.Equal(got, want) {
		r.t.Fatalf("step %d: held effects after the move to %s: %v, want %v", step, id, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	if r.s.head != id {
		r.t.Fatalf("step %d: head %s after the move to %s", step, r.s.head, id)
	}
}

func (r *rig) doc() string {
	r.t.Helper()
	d, err := r.s.state.Get("")
	if err != nil {
		r.t.Fatal(err)
	}
	return string(d)
}

func (r *rig) heldNow() map[uint64]bool {
	out := map[uint64]bool{}
	r.fx.mu.Lock()
	defer r.fx.mu.Unlock()
	for _, e := range r.fx.effects {
		if e.Status == "held" {
			out[e.Seq] = true
		}
	}
	return out
}

func (r *rig) randomPatch(rng *rand.Rand, i int) {
	r.t.Helper()
	key := fmt.Sprintf("/k%d", rng.IntN(6))
	var op state.Op
	switch rng.IntN(3) {
	case 0:
		op = state.Op{Op: state.OpAdd, Path: key, Value: json.RawMessage(fmt.Sprint(i))}
	case 1:
		op = state.Op{Op: state.OpAdd, Path: "/list", Value: json.RawMessage(`[]`)}
	default:
		if _, err := r.s.state.Get(key); err != nil {
			return
		}
		op = state.Op{Op: state.OpRemove, Path: key}
	}
	if _, err := r.o.StatePatch(context.Background(), "sb", []state.Op{op}, nil); err != nil {
		r.t.Fatal(err)
	}
}

// TestTreeReferences resolves IDs, names, @, @~N and lease; unknown references are not
// found, names several checkpoints carry are ambiguous.
func TestTreeReferences(t *testing.T) {
	r := newRig(t, 64)
	ctx := context.Background()
	mk := func(name string) string {
		c, err := r.o.Checkpoint(ctx, "sb", api.CheckpointRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	c2, c3 := mk("try"), mk("")
	if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: "lease"}); err != nil {
		t.Fatal(err)
	}
	c4, c5 := mk("try"), mk("best")
	for ref, want := range map[string]string{"@": c5, "@~1": c4, "@~2": "1", "lease": "1", "best": c5, c3: c3, " 3 ": c3} {
		i, err := r.s.resolve(ref)
		if err != nil || r.s.ckpts[i].ID != want {
			t.Errorf("resolve %q: %v, want %s", ref, err, want)
		}
	}
	for ref, check := range map[string]func(error) bool{"try": errdefs.IsInvalidArgument, "@~3": errdefs.IsNotFound,
		"nope": errdefs.IsNotFound, "99": errdefs.IsNotFound, "@~x": errdefs.IsInvalidArgument, "": errdefs.IsInvalidArgument} {
		if _, err := r.s.resolve(ref); !check(err) {
			t.Errorf("resolve %q: %v", ref, err)
		}
	}
	for _, bad := range []string{"12", "lease", "a b", "x/y"} {
		if _, err := r.o.Checkpoint(ctx, "sb", api.CheckpointRequest{Name: bad}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	// Rollback deletes nothing; the listing shows the tree by its parent links.
	if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: c2}); err != nil {
		t.Fatal(err)
	}
	list, err := r.o.Checkpoints(ctx, "sb")
	if err != nil || len(list) != 5 {
		t.Fatalf("list %+v: %v", list, err)
	}
	parents := map[string]string{}
	for _, c := range list {
		parents[c.ID] = c.Parent
		if c.Head != (c.ID == c2) {
			t.Errorf("checkpoint %s head=%v", c.ID, c.Head)
		}
	}
	if parents[c3] != c2 || parents[c4] != "1" || parents[c5] != c4 || parents[c2] != "1" {
		t.Fatalf("parents %v", parents)
	}
}

// TestTreeCommitRule: after a commit only checkpoints below the commit point are targets
// without --force; a branch that does not hold the commit point is behind it.
func TestTreeCommitRule(t *testing.T) {
	r := newRig(t, 64)
	ctx := context.Background()
	c2 := r.checkpoint()
	if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: "1"}); err != nil {
		t.Fatal(err)
	}
	c3 := r.checkpoint() // another branch
	c4 := r.checkpoint()
	if _, err := r.o.Commit(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	c5 := r.checkpoint()
	for _, to := range []string{c2, c3, c4, "1"} {
		if _, err := r.s.rollbackTarget(api.RollbackRequest{To: to}); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("rollback to %s behind the commit point %s: %v", to, c4, err)
		}
	}
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: c5}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: c2, Force: true}); err != nil {
		t.Fatal(err)
	}
	list, _ := r.o.Checkpoints(ctx, "sb")
	for _, c := range list {
		if want := c.ID == "1" || c.ID == c3 || c.ID == c4; c.Committed != want {
			t.Errorf("checkpoint %s committed=%v", c.ID, c.Committed)
		}
	}
}

// TestTreeRetention bounds the tree per branch and in total, folding single-child
// checkpoints first, and keeps the head, pinned checkpoints, branch points and the lease.
func TestTreeRetention(t *testing.T) {
	r := newRig(t, 8)
	r.o.opts.RetainBranch = 5
	ctx := context.Background()
	pc, err := r.o.Checkpoint(ctx, "sb", api.CheckpointRequest{Pin: true})
	pinned := pc.ID
	if err != nil {
		t.Fatal(err)
	}
	var tips []string
	for b := 0; b < 4; b++ {
		if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: pinned}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 6; i++ {
			r.patch()
			tips = append(tips[:b], r.checkpoint())
		}
	}
	if len(r.s.ckpts) > 8 {
		t.Fatalf("%d checkpoints kept, want at most 8: %v", len(r.s.ckpts), ids(r.s.ckpts))
	}
	for _, c := range r.s.ckpts {
		if len(r.s.children(c.ID)) == 0 && len(r.s.ancestors(c.ID)) > 5 {
			t.Errorf("branch to %s holds %d checkpoints", c.ID, len(r.s.ancestors(c.ID)))
		}
	}
	for _, must := range []string{"1", pinned, r.s.head} {
		if r.s.find(must) < 0 {
			t.Errorf("checkpoint %s dropped", must)
		}
	}
	// Unpinned, the checkpoint may go; pinned again, a kept one stays.
	if ck, err := r.o.Pin(ctx, "sb", pinned, false); err != nil || ck.Pinned {
		t.Fatalf("unpin: %+v %v", ck, err)
	}
	if _, err := r.o.Pin(ctx, "sb", "nope", true); !errdefs.IsNotFound(err) {
		t.Fatalf("pin of an unknown checkpoint: %v", err)
	}
	// Every kept checkpoint is still a good target: the fake layer store and records agree.
	for _, c := range r.s.ckpts {
		if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: c.ID}); err != nil {
			t.Fatalf("rollback to %s after retention: %v", c.ID, err)
		}
	}
}
