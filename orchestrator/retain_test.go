package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
)

// foldRig is a rig whose second checkpoint is big (its fold runs after the answer) and
// whose first fold blocks in its preparation until release is closed; prepared is closed
// when it got there.
func foldRig(t *testing.T, retain int) (*rig, chan struct{}, chan struct{}) {
	r := newRig(t, retain)
	r.fs.entries = map[string]int{"2": 5000}
	prepared, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.fs.onFold = func() { once.Do(func() { close(prepared); <-release }) }
	var unblock sync.Once
	t.Cleanup(func() { unblock.Do(func() { close(release) }) }) // before the rig's, which waits for the folder
	release2 := make(chan struct{})
	go func() { <-release2; unblock.Do(func() { close(release) }) }()
	for i := 0; r.count() < retain+1; i++ { // the last one starts the folder
		if i > 2*retain {
			t.Fatal("the tree never went past its bound: no fold ran after the answer")
		}
		r.patch()
		r.checkpoint()
	}
	select {
	case <-prepared:
	case <-time.After(10 * time.Second):
		t.Fatal("no fold prepared after the checkpoint past the bound")
	}
	return r, prepared, release2
}

// count returns how many checkpoints the session holds.
func (r *rig) count() int {
	r.s.mu.RLock()
	defer r.s.mu.RUnlock()
	return len(r.s.ckpts)
}

// checkpointWithin checkpoints, failing the test if that takes more than a few seconds (it
// would wait for a fold's preparation).
func (r *rig) checkpointWithin() {
	r.t.Helper()
	done := make(chan error, 1)
	go func() {
		r.patch()
		_, err := r.o.Checkpoint(context.Background(), "sb", api.CheckpointRequest{})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			r.t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		r.t.Fatal("a checkpoint waited for retention's fold")
	}
}

// settled waits for the folder and checks the session and the store agree.
func (r *rig) settled() {
	r.t.Helper()
	r.s.bg.Wait()
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.s.folding {
		r.t.Fatal("the folder stopped but is still marked running")
	}
	if got, want := r.fs.Checkpoints(), ids(r.s.ckpts); !slices.Equal(got, want) {
		r.t.Fatalf("store holds %v, session %v", got, want)
	}
}

// TestRetentionFoldsBigCheckpointsAfterTheAnswer: past the bound, folding a big checkpoint
// runs after the checkpoint's answer, without the session lock (more checkpoints go on
// meanwhile, up to the slack), and the victims that piled up meanwhile fold in one run;
// the records follow (the child's parent and state ops are the folded ones').
func TestRetentionFoldsBigCheckpointsAfterTheAnswer(t *testing.T) {
	r, _, release := foldRig(t, 32) // slack 4
	for range 3 {
		r.checkpointWithin()
	}
	if n := r.count(); n != 36 {
		t.Fatalf("%d checkpoints while the fold is prepared, want 36 (bound 32, 4 waiting)", n)
	}
	close(release)
	r.settled()
	r.fs.foldMu.Lock()
	folds := slices.Clone(r.fs.folds)
	r.fs.foldMu.Unlock()
	if want := [][]string{{"2"}, {"3", "4", "5"}}; fmt.Sprint(folds) != fmt.Sprint(want) {
		t.Fatalf("folds %v, want %v (the piled-up victims in one run)", folds, want)
	}
	if n := len(r.s.ckpts); n != 32 || r.s.ckpts[0].ID != "1" || r.s.ckpts[1].ID != "6" {
		t.Fatalf("retained %v", ids(r.s.ckpts))
	}
	var onDisk ckptRecord
	if err := json.Unmarshal(r.fs.meta["6"], &onDisk); err != nil || r.s.ckpts[1].Parent != "1" || onDisk.Parent != "1" {
		t.Fatalf("checkpoint 6 after the folds: parent %q, recorded %q (%v); want 1", r.s.ckpts[1].Parent, onDisk.Parent, err)
	}
	r.st.doc = "dirty"
	for _, to := range []string{"1", "6", "36"} {
		if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: to}); err != nil {
			t.Fatalf("rollback to %s after the folds: %v", to, err)
		}
	}
}

// TestRetentionFoldOvertaken: a fold whose victims changed while it was prepared is not
// installed: when the slack is exceeded the checkpoint folds inline, a rollback makes the
// victim the head (protected), the session ends. The folder chooses again or stops, and
// the store and the session still agree.
func TestRetentionFoldOvertaken(t *testing.T) {
	t.Run("slack exceeded", func(t *testing.T) {
		r, _, release := foldRig(t, 16) // slack 2
		for range 2 {                   // 18: two waiting; 19: three, past the slack
			r.checkpointWithin()
		}
		if n := r.count(); n != 16 {
			t.Fatalf("%d checkpoints past the slack, want 16 (folded inline)", n)
		}
		close(release)
		r.settled()
		if n := len(r.s.ckpts); n != 16 {
			t.Fatalf("%d checkpoints after the overtaken fold", n)
		}
	})
	t.Run("victim became the head", func(t *testing.T) {
		r, _, release := foldRig(t, 16)
		if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: "2"}); err != nil {
			t.Fatal(err)
		}
		close(release)
		r.settled()
		if r.s.find("2") < 0 {
			t.Fatalf("the head was folded away: %v", ids(r.s.ckpts))
		}
		if n := len(r.s.ckpts); n != 16 {
			t.Fatalf("%d checkpoints, want 16 (another victim folded)", n)
		}
	})
	t.Run("always overtaken", func(t *testing.T) { // each try writes a merged pack
		r, _, release := foldRig(t, 16)
		r.fs.refuseFolds.Store(true)
		close(release)
		r.settled()
		r.fs.foldMu.Lock()
		n := len(r.fs.folds)
		r.fs.foldMu.Unlock()
		if n != maxOvertaken {
			t.Fatalf("%d folds prepared for a tree that overtook every one, want %d", n, maxOvertaken)
		}
		r.fs.refuseFolds.Store(false)
		r.checkpointWithin() // starts the folder anew
		r.settled()
		if c := r.count(); c > 16+r.o.foldSlack() {
			t.Fatalf("%d checkpoints after the folder started again", c)
		}
	})
	t.Run("session ended", func(t *testing.T) {
		r, _, release := foldRig(t, 16)
		r.s.mu.Lock()
		r.s.ended = true
		r.s.mu.Unlock()
		close(release)
		r.settled()
		if n := len(r.s.ckpts); n != 17 || r.s.find("2") < 0 {
			t.Fatalf("a fold was installed into an ended session: %v", ids(r.s.ckpts))
		}
	})
}

// TestRetentionFoldsSmallCheckpointsInline: a fold of few entries runs with the checkpoint
// that needs it, so the bound holds at its answer.
func TestRetentionFoldsSmallCheckpointsInline(t *testing.T) {
	r := newRig(t, 16)
	for range 20 {
		r.patch()
		r.checkpoint()
		if n := len(r.s.ckpts); n > 16 {
			t.Fatalf("%d checkpoints at the answer, bound 16", n)
		}
	}
	r.settled()
	if len(r.fs.folds) != 0 {
		t.Fatalf("small folds went to the folder: %v", r.fs.folds)
	}
}

// TestAutomaticL2IsCompactedAfterTheAnswer: the checkpoint after l2_every L1s is recorded
// as an L2 but cut as a delta (a full capture of a big upper dir froze the sandbox for tens
// of milliseconds), and the folder then makes it self-contained.
func TestAutomaticL2IsCompactedAfterTheAnswer(t *testing.T) {
	r := newRig(t, 64)
	r.o.opts.L2Every = 3
	var levels []string
	for range 5 {
		r.patch()
		c, err := r.o.Checkpoint(context.Background(), "sb", api.CheckpointRequest{})
		if err != nil {
			t.Fatal(err)
		}
		levels = append(levels, c.Level)
	}
	r.settled()
	if got := fmt.Sprint(levels); got != "[l1 l1 l1 l2 l1]" {
		t.Fatalf("levels %s", got)
	}
	if got := fmt.Sprint(r.fs.levels); got != fmt.Sprint([]overlay.Level{overlay.L1, overlay.L1, overlay.L1, overlay.L1, overlay.L1, overlay.L1}) {
		t.Fatalf("captures asked for levels %s: the automatic L2 must be cut as a delta", got)
	}
	if got := fmt.Sprint(r.fs.compacts); got != "[5]" {
		t.Fatalf("compactions %s, want [5] (the automatic l2)", got)
	}
}
