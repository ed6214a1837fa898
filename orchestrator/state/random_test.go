package state

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRandomHistory drives a store with random patches (most of them valid), rollbacks to
// random points, snapshots, compactions and reopens, and checks it against a model: the
// document at every point of the history, recorded when that point was made.
func TestRandomHistory(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { randomHistory(t, seed) })
	}
}

func randomHistory(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 2))
	var applied, rollbacks int
	dir := t.TempDir()
	ctx := context.Background()
	s := openStore(t, dir, WithSnapshotEvery(25))
	defer func() { s.Close() }()
	patch(t, s, `{"op":"add","path":"","value":{"a":[1,{"x":2}],"b":{"x":[0],"y":1},"c":0}}`)
	states := map[uint64]string{0: "{}", 1: getDoc(t, s)}
	points := []uint64{0, 1} // the model's live history
	for step := range 600 {
		switch r := rng.IntN(100); {
		case r < 80:
			before := getDoc(t, s)
			res, err := s.Patch(ctx, randomPatch(rng, before), PatchOptions{})
			if err != nil {
				if got := getDoc(t, s); got != before {
					t.Fatalf("step %d: failed patch changed the document: %s -> %s", step, before, got)
				}
				continue
			}
			applied++
			states[res.Seq] = getDoc(t, s) // the model knows the states between patches only
			points = append(points, res.Seq)
		case r < 92:
			i := max(0, len(points)-1-rng.IntN(8)) // mostly recent points, as agents do
			if rng.IntN(10) == 0 {
				i = rng.IntN(len(points))
			}
			target := points[i]
			if _, err := s.RollbackTo(ctx, target); err != nil {
				t.Fatalf("step %d: rollback to %d: %v", step, target, err)
			}
			rollbacks++
			if got := getDoc(t, s); got != states[target] {
				t.Fatalf("step %d: after rollback to %d: %s, want %s", step, target, got, states[target])
			}
			if target != points[len(points)-1] {
				points = append(points[:i+1], s.Seq())
				states[s.Seq()] = states[target]
			}
		case r < 95:
			keep := points[rng.IntN(len(points))]
			if err := s.Compact(ctx, keep); err != nil {
				t.Fatalf("step %d: compact to %d: %v", step, keep, err)
			}
			points = points[slices.Index(points, keep):]
		default:
			doc := getDoc(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, dir, WithSnapshotEvery(25))
			if got := getDoc(t, s); got != doc {
				t.Fatalf("step %d: after reopen: %s, want %s", step, got, doc)
			}
		}
		if s.Seq() != points[len(points)-1] {
			t.Fatalf("step %d: seq %d, model %d", step, s.Seq(), points[len(points)-1])
		}
	}
	if err := s.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d patches applied, %d rollbacks, final seq %d", applied, rollbacks, s.Seq())
	if applied < 100 || rollbacks < 30 {
		t.Fatalf("only %d patches applied and %d rollbacks: the generator is too weak", applied, rollbacks)
	}
}

func randomPatch(rng *rand.Rand, doc string) []Op {
	root, _ := decodeValue([]byte(doc))
	ops := make([]Op, 1+rng.IntN(4)/3)
	for i := range ops {
		ops[i] = randomOp(rng, root)
	}
	return ops
}

// randomOp makes an op that usually applies to root: paths are picked from the document.
func randomOp(rng *rand.Rand, root any) Op {
	kinds := []string{OpAdd, OpAdd, OpRemove, OpReplace, OpMove, OpCopy, OpTest, OpAppend}
	o := Op{Op: kinds[rng.IntN(len(kinds))], Path: existingPath(rng, root).String()}
	switch o.Op {
	case OpAdd, OpAppend:
		o.Path = newPath(rng, root).String()
	case OpMove, OpCopy:
		o.From, o.Path = o.Path, newPath(rng, root).String()
	}
	if o.Op != OpRemove && o.Op != OpMove && o.Op != OpCopy {
		o.Value = []byte(randomValue(rng, 2))
	}
	return o
}

// existingPath walks down from root to a random existing value.
func existingPath(rng *rand.Rand, v any) pointer {
	p := pointer{}
	for rng.IntN(5) > 0 {
		switch c := v.(type) {
		case map[string]any:
			keys := slices.Sorted(maps.Keys(c))
			if len(keys) == 0 {
				return p
			}
			k := keys[rng.IntN(len(keys))]
			p, v = p.child(k), c[k]
		case []any:
			if len(c) == 0 {
				return p
			}
			i := rng.IntN(len(c))
			p, v = p.child(fmt.Sprint(i)), c[i]
		default:
			return p
		}
	}
	return p
}

// newPath names a new member or array position inside an existing container.
func newPath(rng *rand.Rand, root any) pointer {
	p := existingPath(rng, root)
	v, _ := (&document{root: root}).get(p)
	if a, ok := v.([]any); ok {
		if rng.IntN(3) == 0 {
			return p.child("-")
		}
		return p.child(fmt.Sprint(rng.IntN(len(a) + 1)))
	}
	return p.child([]string{"x", "y", "k", "l"}[rng.IntN(4)])
}

func randomValue(rng *rand.Rand, depth int) string {
	switch r := rng.IntN(7); {
	case depth == 0 || r < 2:
		return fmt.Sprint(rng.IntN(5))
	case r == 2:
		return `"s"`
	case r == 3:
		return "null"
	case r == 4:
		return "[" + randomValue(rng, depth-1) + "," + randomValue(rng, depth-1) + "]"
	default:
		return `{"x":` + randomValue(rng, depth-1) + `,"y":[]}`
	}
}
