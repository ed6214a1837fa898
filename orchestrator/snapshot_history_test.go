package orchestrator

import (
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func TestSnapshotHistoryCarriesOver(t *testing.T) {
	src := &session{dir: t.TempDir(), inherited: []api.Checkpoint{{ID: "1", Message: "from an older snapshot"}}}
	parent := ""
	for _, id := range []string{"2", "3", "4"} {
		src.ckpts = append(src.ckpts, ckptRecord{Checkpoint: api.Checkpoint{ID: id, Parent: parent}})
		parent = id
	}
	hist := src.snapshotHistory("3")
	if len(hist) != 3 || hist[0].Message != "from an older snapshot" || hist[2].ID != "3" {
		t.Fatalf("history up to 3: %+v", hist)
	}
	f := &fetched{cfg: snapshotConfig{Checkpoint: "3", History: hist}}
	dst := &session{dir: t.TempDir(), meta: sessionMeta{Next: 1}}
	if err := dst.applySeed(seedFor(f, "restored")); err != nil {
		t.Fatal(err)
	}
	if dst.meta.Next != 3 || len(dst.inherited) != 2 {
		t.Fatalf("restored session: next %d, inherited %+v", dst.meta.Next, dst.inherited)
	}
	reopened := &session{dir: dst.dir}
	if err := reopened.loadInherited(); err != nil || len(reopened.inherited) != 2 || reopened.inherited[1].ID != "2" {
		t.Fatalf("after a restart: %+v (%v)", reopened.inherited, err)
	}
}
