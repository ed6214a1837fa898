//go:build linux

package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// foldFixture captures c0 (many files), then c1..c4, each changing a few: walks holds the
// merged tree at each checkpoint.
func foldFixture(t *testing.T) (*fixture, map[string]map[string]nodeInfo) {
	f := newFixture(t, standardLower)
	walks := map[string]map[string]nodeInfo{}
	must(t, os.MkdirAll(f.m("many"), 0o755))
	for i := range 200 {
		putFile(t, f.m(fmt.Sprintf("many/f%03d", i)), fmt.Sprintf("content %d", i))
	}
	f.capture(t, "c0", L1)
	walks["c0"] = walkTree(t, f.merged)
	for i := 1; i <= 4; i++ {
		putFile(t, f.m(fmt.Sprintf("many/f%03d", i)), fmt.Sprintf("changed at c%d", i))
		putFile(t, f.m(fmt.Sprintf("new%d.txt", i)), "new")
		if i == 3 {
			must(t, os.Remove(f.m("many/f100")))
		}
		id := fmt.Sprintf("c%d", i)
		f.capture(t, id, L1)
		walks[id] = walkTree(t, f.merged)
	}
	return f, walks
}

// packsOnDisk lists the checkpoint packs in the store dir.
func packsOnDisk(t *testing.T, f *fixture) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(f.storeDir, "*"+packSuffix))
	must(t, err)
	var ids []string
	for _, n := range names {
		ids = append(ids, strings.TrimSuffix(filepath.Base(n), packSuffix))
	}
	slices.Sort(ids)
	return ids
}

// TestPrepareFoldLetsTheStoreWork folds c0..c2 into c3 in one prepared fold: while it is
// prepared the store serves a rollback and a capture (it holds no lock), the commit then
// installs it, and every checkpoint left restores as it was, across a reopen; the folded
// packs are gone once Finish returns.
func TestPrepareFoldLetsTheStoreWork(t *testing.T) {
	f, walks := foldFixture(t)
	p, err := f.s.PrepareFold(t.Context(), []string{"c1", "c2"}, nil)
	must(t, err)
	f.rollback(t, "c4") // the store is free meanwhile
	putFile(t, f.m("later.txt"), "after the prepare")
	f.capture(t, "c5", L1)
	walks["c5"] = walkTree(t, f.merged)
	must(t, p.Commit(t.Context()))
	must(t, p.Finish())
	verifyNone(t, f, f.s.Head(), VerifyMtimes())
	if got := f.s.Checkpoints(); !slices.Equal(got, []string{"c0", "c3", "c4", "c5"}) {
		t.Fatalf("checkpoints after the fold: %v", got)
	}
	if got := packsOnDisk(t, f); !slices.Equal(got, []string{"c0", "c3", "c4", "c5"}) {
		t.Fatalf("packs after the fold: %v", got)
	}
	if par, _ := f.s.Parent("c3"); par != "c0" {
		t.Fatalf("c3's parent after the fold: %q", par)
	}
	for _, reopen := range []bool{false, true} {
		if reopen {
			f.reopen(t)
		}
		for _, id := range []string{"c3", "c0", "c5", "c4"} {
			f.rollback(t, id)
			assertTree(t, walks[id], walkTree(t, f.merged), true)
			verifyNone(t, f, id, VerifyMtimes())
		}
	}
}

// TestFoldRefusesAChangedTree: a fold prepared before its checkpoint became a branch point
// (or the head) is refused at commit, with nothing changed and its pack removed.
func TestFoldRefusesAChangedTree(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *fixture)
	}{
		{"branch point", func(f *fixture) {
			f.rollback(t, "c1")
			putFile(t, f.m("branch.txt"), "b")
			f.capture(t, "c5", L1)
		}},
		{"head", func(f *fixture) { f.rollback(t, "c1") }},
		{"deleted", func(f *fixture) { must(t, f.s.Delete(t.Context(), "c2")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, walks := foldFixture(t)
			p, err := f.s.PrepareFold(t.Context(), []string{"c1", "c2"}, nil)
			must(t, err)
			tc.change(f)
			before := f.s.Checkpoints()
			if err := p.Commit(t.Context()); !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("commit of a fold the tree overtook: %v", err)
			}
			if got := f.s.Checkpoints(); !slices.Equal(got, before) {
				t.Fatalf("checkpoints %v after a refused fold, were %v", got, before)
			}
			tmps, _ := filepath.Glob(filepath.Join(f.storeDir, tempPrefix+"*"))
			if len(tmps) > 1 { // the store's spare temp file may be there
				t.Fatalf("temp files left: %v", tmps)
			}
			f.reopen(t)
			for _, id := range []string{"c0", "c1", "c3", "c4"} {
				if !slices.Contains(before, id) {
					continue
				}
				f.rollback(t, id)
				assertTree(t, walks[id], walkTree(t, f.merged), true)
			}
		})
	}
}

// TestFoldInterruptedBeforeFinish: a crash after a fold's commit, before Finish, leaves the
// folded packs beside the merged one; load drops all of them (the merged pack names every
// one), and a later delete finishes the fold first, so they never come back as checkpoints.
func TestFoldInterruptedBeforeFinish(t *testing.T) {
	f, walks := foldFixture(t)
	p, err := f.s.PrepareFold(t.Context(), []string{"c1", "c2"}, nil)
	must(t, err)
	must(t, p.Commit(t.Context()))
	if got := packsOnDisk(t, f); !slices.Equal(got, []string{"c0", "c1", "c2", "c3", "c4"}) {
		t.Fatalf("packs before Finish: %v (the folded ones stay until it)", got)
	}
	f.reopen(t) // as if the daemon died here
	if got := f.s.Checkpoints(); !slices.Equal(got, []string{"c0", "c3", "c4"}) {
		t.Fatalf("checkpoints after a crash before Finish: %v", got)
	}
	f.rollback(t, "c3")
	assertTree(t, walks["c3"], walkTree(t, f.merged), true)

	// Unfinished, then the merged checkpoint folded again (into c4) or deleted as a leaf
	// (then c1 is the head): the first fold's packs go first.
	for _, again := range []string{"fold", "delete"} {
		f, walks := foldFixture(t)
		p, err := f.s.PrepareFold(t.Context(), []string{"c2", "c3"}, nil)
		must(t, err)
		must(t, p.Commit(t.Context()))
		var want []string
		if again == "fold" {
			must(t, f.s.Delete(t.Context(), "c1")) // c1 folds into c4
			want = []string{"c0", "c4"}
		} else {
			must(t, f.s.Delete(t.Context(), "c4"))
			want = []string{"c0", "c1"}
		}
		f.reopen(t)
		if got := f.s.Checkpoints(); !slices.Equal(got, want) {
			t.Fatalf("%s over an unfinished fold: checkpoints %v, want %v", again, got, want)
		}
		last := want[len(want)-1]
		f.rollback(t, last)
		assertTree(t, walks[last], walkTree(t, f.merged), true)
	}
}

// TestMergeManifestsSortedMerge checks the one-pass merge against the map it replaced: the
// later layer wins, a full layer hides those above it, the result is in path order.
func TestMergeManifestsSortedMerge(t *testing.T) {
	e := func(p, ck string) *Entry { return &Entry{Path: p, Kind: KindFile, ckpt: ck} }
	a := &manifest{ID: "a", Full: true, Entries: []*Entry{e("b", "a"), e("a/x", "a"), e("a", "a"), e("c", "a")}}
	b := &manifest{ID: "b", Parent: "a", Entries: []*Entry{e("c", "b"), e("a/x", "b"), {Path: "b", Kind: KindGone, ckpt: "b"}}}
	c := &manifest{ID: "c", Parent: "b", Entries: []*Entry{e("d", "c"), e("a-", "c"), e("a/x", "c")}}
	m := mergeManifests([]*manifest{a, b, c})
	var got []string
	for _, x := range m.Entries {
		got = append(got, x.Path+"@"+x.ckpt+fmt.Sprint(x.Kind == KindGone))
	}
	want := []string{"a@afalse", "a/x@cfalse", "a-@cfalse", "b@btrue", "c@bfalse", "d@cfalse"}
	if !slices.Equal(got, want) {
		t.Fatalf("merged entries %v, want %v", got, want)
	}
	if !m.Full || m.Parent != "" || m.Absorbed != "b" || !slices.Equal(m.Folded, []string{"a"}) {
		t.Fatalf("merged manifest: full %v parent %q absorbed %q folded %v", m.Full, m.Parent, m.Absorbed, m.Folded)
	}
	c.Full = true
	if m := mergeManifests([]*manifest{a, b, c}); len(m.Entries) != 3 {
		t.Fatalf("a full last layer must hide the others: %d entries", len(m.Entries))
	}
}

// TestPrepareCompact makes c3 self-contained without holding the store: with the head below
// it (the head's state moves to the new pack) and on another branch (it stays), c3 and
// every other checkpoint restore as they were, across a reopen, and its ancestors can go
// without it. A compaction whose ancestry was folded meanwhile is refused.
func TestPrepareCompact(t *testing.T) {
	for _, head := range []string{"below", "other branch"} {
		t.Run(head, func(t *testing.T) {
			f, walks := foldFixture(t)
			p, err := f.s.PrepareCompact(t.Context(), "c3")
			must(t, err)
			if head == "other branch" {
				f.rollback(t, "c1")
				putFile(t, f.m("branch.txt"), "b")
				f.capture(t, "c5", L1)
				walks["c5"] = walkTree(t, f.merged)
			}
			must(t, p.Commit(t.Context()))
			must(t, p.Finish())
			if pos := f.s.position("c3"); !f.s.chain[pos].Full || f.s.chain[pos].Parent != "c2" {
				t.Fatalf("c3 after its compaction: full %v, parent %q", f.s.chain[pos].Full, f.s.chain[pos].Parent)
			}
			verifyNone(t, f, f.s.Head(), VerifyMtimes()) // the head's state reads the new pack
			if head == "below" {                         // a capture from the moved state
				putFile(t, f.m("many/f150"), "after the compaction")
				f.capture(t, "c5", L1)
				walks["c5"] = walkTree(t, f.merged)
			}
			for _, reopen := range []bool{false, true} {
				if reopen {
					f.reopen(t)
				}
				for _, id := range []string{"c3", "c5", "c0", "c4", "c1"} {
					f.rollback(t, id)
					assertTree(t, walks[id], walkTree(t, f.merged), true)
				}
			}
		})
	}
	t.Run("ancestry folded meanwhile", func(t *testing.T) {
		f, walks := foldFixture(t)
		p, err := f.s.PrepareCompact(t.Context(), "c3")
		must(t, err)
		must(t, f.s.Delete(t.Context(), "c1"))
		if err := p.Commit(t.Context()); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("compaction over a changed ancestry: %v", err)
		}
		f.rollback(t, "c3")
		assertTree(t, walks["c3"], walkTree(t, f.merged), true)
	})
	if p, err := newFixture(t, standardLower).s.PrepareCompact(t.Context(), "nope"); !errdefs.IsNotFound(err) || p != nil {
		t.Fatalf("compaction of a missing checkpoint: %v", err)
	}
}
