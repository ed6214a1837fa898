//go:build linux

package overlay

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// damageFixture has three checkpoints: c0 (a.txt=v0, b.txt=b0), c1 (a.txt=v1), c2 (b.txt=b2).
func damageFixture(t *testing.T) *fixture {
	f := newFixture(t, nil)
	putFile(t, f.m("a.txt"), "v0 "+strings.Repeat("a", 5000))
	putFile(t, f.m("b.txt"), "b0")
	f.capture(t, "c0", L2)
	putFile(t, f.m("a.txt"), "v1 "+strings.Repeat("a", 5000))
	f.capture(t, "c1", L1)
	putFile(t, f.m("b.txt"), "b2")
	f.capture(t, "c2", L1)
	return f
}

// contentOffset returns where path's content lies in checkpoint id's own pack.
func contentOffset(t *testing.T, f *fixture, id, path string) int64 {
	t.Helper()
	for _, m := range f.s.chain {
		for _, e := range m.Entries {
			if m.ID == id && e.Path == path && e.ckpt == id {
				return e.Off
			}
		}
	}
	t.Fatalf("no content of %s in %s", path, id)
	return 0
}

// flip xors n bytes of file p from off.
func flip(t *testing.T, p string, off int64, n int) {
	t.Helper()
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	must(t, err)
	defer fh.Close()
	buf := make([]byte, n)
	_, err = fh.ReadAt(buf, off)
	must(t, err)
	for i := range buf {
		buf[i] ^= 0x5a
	}
	_, err = fh.WriteAt(buf, off)
	must(t, err)
}

func (f *fixture) pack(id string) string { return filepath.Join(f.storeDir, id+packSuffix) }

func readMerged(t *testing.T, f *fixture, p string) string {
	t.Helper()
	data, err := os.ReadFile(f.m(p))
	must(t, err)
	return string(data)
}

// Four flipped bytes in an older pack's file data: the rollback that needs them refuses,
// naming the checkpoint and the path, before anything is written; Verify and Scrub report
// the damage; checkpoints that do not use the damaged content stay usable.
func TestDamagedContentIsRefusedAndReported(t *testing.T) {
	f := damageFixture(t)
	flip(t, f.pack("c1"), contentOffset(t, f, "c1", "a.txt")+100, 4)
	f.reopen(t)
	mm, err := f.s.Verify(context.Background(), "c2", f.merged)
	must(t, err)
	if !hasMismatch(mm, "a.txt", "damaged") {
		t.Fatalf("verify c2 (which shows c1's a.txt) did not report the damage: %+v", mm)
	}
	putFile(t, f.m("a.txt"), "live")
	putFile(t, f.m("b.txt"), "live")

	_, err = f.s.Rollback(context.Background(), RollbackRequest{Merged: f.merged, Upper: f.upper, Lower: []string{f.lower}, Target: "c1"})
	var damage *DamageError
	if !errors.As(err, &damage) || !errdefs.IsDataLoss(err) || damage.Checkpoint != "c1" || damage.Path != "a.txt" {
		t.Fatalf("rollback to c1 over damaged content: %v, want a DamageError for c1 a.txt", err)
	}
	if a, b := readMerged(t, f, "a.txt"), readMerged(t, f, "b.txt"); a != "live" || b != "live" {
		t.Fatalf("refused rollback wrote files: a.txt %.10q, b.txt %q", a, b)
	}
	if got := f.s.Checkpoints(); len(got) != 3 {
		t.Fatalf("refused rollback changed the chain: %v", got)
	}

	dmg, err := f.s.Scrub(context.Background())
	must(t, err)
	if len(dmg) != 1 || dmg[0].Checkpoint != "c1" || dmg[0].Path != "a.txt" {
		t.Fatalf("scrub = %+v, want c1 a.txt", dmg)
	}

	// c0 holds its own copy of a.txt: rolling back to it works.
	f.rollback(t, "c0")
	if got := readMerged(t, f, "a.txt"); !strings.HasPrefix(got, "v0 ") {
		t.Fatalf("a.txt after rollback to c0: %.10q", got)
	}
}

// An interrupted merge (Delete) must not carry damaged content into a new pack under a fresh
// digest.
func TestDeleteRefusesDamagedContent(t *testing.T) {
	f := damageFixture(t)
	flip(t, f.pack("c1"), contentOffset(t, f, "c1", "a.txt"), 1)
	f.reopen(t)
	err := f.s.Delete(context.Background(), "c1")
	var damage *DamageError
	if !errors.As(err, &damage) || damage.Checkpoint != "c1" {
		t.Fatalf("delete c1 (merging it into c2) over damaged content: %v", err)
	}
}

func hasMismatch(mm []Mismatch, path, what string) bool {
	for _, m := range mm {
		if m.Path == path && m.What == what {
			return true
		}
	}
	return false
}

// The corruption matrix of packs: each case damages the store on disk and reopens it. The
// store opens; the checkpoints before the damage stay usable (rolled back to, checked); the
// damaged one and those that depend on it are set aside (kept on disk) and reported.
func TestPackCorruptionMatrix(t *testing.T) {
	cases := []struct {
		name    string
		damage  func(t *testing.T, f *fixture)
		usable  []string
		damaged []string
	}{
		{"torn tail of the latest pack", func(t *testing.T, f *fixture) {
			truncateBy(t, f.pack("c2"), 7)
		}, []string{"c0", "c1"}, []string{"c2"}},
		{"flipped byte in a middle pack's manifest", func(t *testing.T, f *fixture) {
			flip(t, f.pack("c1"), size(t, f.pack("c1"))-footerSize-10, 1)
		}, []string{"c0"}, []string{"c1", "c2"}},
		{"flipped byte in the latest pack's footer", func(t *testing.T, f *fixture) {
			flip(t, f.pack("c2"), size(t, f.pack("c2"))-3, 1)
		}, []string{"c0", "c1"}, []string{"c2"}},
		{"missing middle pack", func(t *testing.T, f *fixture) {
			must(t, os.Remove(f.pack("c1")))
		}, []string{"c0"}, []string{"c2"}},
		{"missing first pack", func(t *testing.T, f *fixture) {
			must(t, os.Remove(f.pack("c0")))
		}, nil, []string{"c1", "c2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := damageFixture(t)
			tc.damage(t, f)
			f.reopen(t)
			if got := f.s.Checkpoints(); strings.Join(got, ",") != strings.Join(tc.usable, ",") {
				t.Fatalf("usable checkpoints %v, want %v", got, tc.usable)
			}
			var got []string
			for _, d := range f.s.Damaged() {
				got = append(got, d.Checkpoint)
			}
			if strings.Join(sorted(got), ",") != strings.Join(tc.damaged, ",") {
				t.Fatalf("damaged %v, want %v", got, tc.damaged)
			}
			for _, id := range tc.damaged {
				if m, _ := filepath.Glob(filepath.Join(f.storeDir, id+damagedSuffix+"-*")); len(m) == 0 {
					t.Fatalf("damaged pack of %s was not kept", id)
				}
			}
			if len(tc.usable) > 0 {
				first := tc.usable[0]
				f.rollback(t, first)
				if mm, err := f.s.Verify(context.Background(), first, f.merged); err != nil || len(mm) > 0 {
					t.Fatalf("verify %s after rollback: %v %+v", first, err, mm)
				}
			}
			// The store keeps working: a new checkpoint never reuses a set-aside pack.
			putFile(t, f.m("c.txt"), "new")
			f.capture(t, "c2", L1)
			f.reopen(t)
			if got := f.s.Checkpoints(); got[len(got)-1] != "c2" {
				t.Fatalf("after a new capture: %v", got)
			}
		})
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func size(t *testing.T, p string) int64 {
	t.Helper()
	st, err := os.Stat(p)
	must(t, err)
	return st.Size()
}

func truncateBy(t *testing.T, p string, n int64) {
	t.Helper()
	must(t, os.Truncate(p, size(t, p)-n))
}

// Packs of manifest version 1 (no digests) still load and roll back.
func TestVersion1PackLoads(t *testing.T) {
	f := damageFixture(t)
	for _, id := range []string{"c0", "c1", "c2"} {
		rewriteAsVersion1(t, f.pack(id))
	}
	f.reopen(t)
	if got := f.s.Checkpoints(); len(got) != 3 {
		t.Fatalf("version 1 packs: %v", got)
	}
	flip(t, f.pack("c1"), contentOffset(t, f, "c1", "a.txt")+100, 1) // undetectable without digests
	f.rollback(t, "c0")
	if got := readMerged(t, f, "a.txt"); !strings.HasPrefix(got, "v0 ") {
		t.Fatalf("a.txt after rollback to c0: %.10q", got)
	}
}

// rewriteAsVersion1 rewrites a pack's manifest as version 1 did: no digests.
func rewriteAsVersion1(t *testing.T, p string) {
	t.Helper()
	fh, err := os.Open(p)
	must(t, err)
	m, err := readManifest(fh)
	must(t, err)
	foot := make([]byte, footerSize)
	_, err = fh.ReadAt(foot, size(t, p)-footerSize)
	must(t, err)
	off := int64(binary.LittleEndian.Uint64(foot[8:]))
	data := make([]byte, off)
	_, err = fh.ReadAt(data, 0)
	must(t, err)
	fh.Close()
	m.Version = 1
	for _, e := range m.Entries {
		e.Sum = 0
	}
	js, err := json.Marshal(m)
	must(t, err)
	if strings.Contains(string(js), `"xxh3"`) {
		t.Fatal("version 1 manifest still has digests")
	}
	binary.LittleEndian.PutUint32(foot[16:], uint32(len(js)))
	binary.LittleEndian.PutUint32(foot[20:], crc32.ChecksumIEEE(js))
	must(t, os.WriteFile(p, append(append(data, js...), foot...), 0o600))
}

// TestDeleteMergesManyContents: merging a full checkpoint of many files (of every size, some
// empty, some the same) into its child copies their contents in runs (copyContentsBulk on a
// filesystem without clones): after a reopen the child restores the same tree; and damage in
// the middle of a run is refused, naming the damaged file.
func TestDeleteMergesManyContents(t *testing.T) {
	build := func(t *testing.T) (*fixture, map[string]nodeInfo) {
		f := newFixture(t, nil)
		for i := 0; i < 400; i++ {
			putFile(t, f.m(fmt.Sprintf("d%d/f%d", i%7, i)), strings.Repeat(string(rune('a'+i%26)), (i*37)%9000))
		}
		f.capture(t, "c0", L2)
		for i := 0; i < 400; i += 50 {
			putFile(t, f.m(fmt.Sprintf("d%d/f%d", i%7, i)), fmt.Sprintf("changed %d", i))
		}
		f.capture(t, "c1", L1)
		want := walkTree(t, f.merged)
		putFile(t, f.m("later.txt"), "later")
		f.capture(t, "c2", L1)
		return f, want
	}
	f, want := build(t)
	must(t, f.s.Delete(t.Context(), "c0"))
	f.reopen(t)
	for d := 0; d < 7; d++ { // every file then comes back from the merged pack's contents
		must(t, os.RemoveAll(f.m(fmt.Sprintf("d%d", d))))
	}
	f.rollback(t, "c1")
	assertTree(t, want, walkTree(t, f.merged), true)

	f, _ = build(t)
	flip(t, f.pack("c0"), contentOffset(t, f, "c0", "d2/f233")+5, 1)
	f.reopen(t)
	var damage *DamageError
	if err := f.s.Delete(t.Context(), "c0"); !errors.As(err, &damage) || damage.Checkpoint != "c0" || damage.Path != "d2/f233" {
		t.Fatalf("delete c0 over damaged content of d2/f233: %v", err)
	}
}
