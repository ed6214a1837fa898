package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/overlay"
)

func TestRollbackTargetCommitPointAndForce(t *testing.T) {
	r := newRig(t, 64)
	r.fx.hold()
	c2 := r.checkpoint()
	if _, err := r.o.Commit(context.Background(), "sb"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: c2}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("unforced rollback to the commit point: %v, want failed precondition", err)
	}
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: "1"}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("unforced rollback before the commit point: %v, want failed precondition", err)
	}
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: c2, Force: true}); err != nil {
		t.Fatalf("forced rollback: %v", err)
	}
	c3 := r.checkpoint()
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: c3}); err != nil {
		t.Fatalf("rollback after the commit point: %v", err)
	}
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: "99"}); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown checkpoint: %v", err)
	}
}

func TestRollbackTargetCompactedLog(t *testing.T) {
	r := newRig(t, 64)
	r.patch()
	c2 := r.checkpoint()
	r.patch()
	c3 := r.checkpoint()
	r.st.base = r.s.ckpts[2].StateSeq // compacted past checkpoint 2
	// Its document is rebuilt from the recorded ops (tree_state.go), unless a record on the
	// way lacks them (written by an earlier version).
	if in, err := r.s.rollbackTarget(api.RollbackRequest{To: c2}); err != nil || !in.Rebuild {
		t.Fatalf("rollback to a compacted checkpoint: %+v, %v; want a rebuild", in, err)
	}
	r.s.ckpts[2].TreeOps = false
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: c2}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("rollback to a compacted checkpoint without recorded ops: %v, want failed precondition", err)
	}
	r.s.ckpts[2].TreeOps = true
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: c3}); err != nil {
		t.Fatal(err)
	}
	// The lease checkpoint stays reachable through its kept document.
	in, err := r.s.rollbackTarget(api.RollbackRequest{To: "1"})
	if err != nil || !in.StateBase {
		t.Fatalf("rollback to the lease checkpoint: %+v, %v; want the kept document", in, err)
	}
}

// TestRetentionKeepsLeaseCheckpoint is issue 12.8: after more checkpoints than Retain, the
// always-kept first checkpoint can still be rolled back to, state included.
func TestRetentionKeepsLeaseCheckpoint(t *testing.T) {
	r := newRig(t, 3)
	r.st.doc = "" // the lease document
	for i := 0; i < 10; i++ {
		r.patch()
		r.checkpoint()
	}
	if len(r.s.ckpts) != 3 || r.s.ckpts[0].ID != "1" {
		t.Fatalf("retained %v, want 3 with the first", ids(r.s.ckpts))
	}
	if r.st.base <= r.s.ckpts[0].StateSeq {
		t.Fatalf("state never compacted (base %d)", r.st.base)
	}
	if r.st.base > r.s.ckpts[1].StateSeq {
		t.Fatalf("compacted to %d, past checkpoint %s (seq %d)", r.st.base, r.s.ckpts[1].ID, r.s.ckpts[1].StateSeq)
	}
	r.st.doc = "dirty"
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: "1"}); err != nil {
		t.Fatalf("rollback to the lease checkpoint after retention: %v", err)
	}
	if r.st.doc != "" {
		t.Fatalf("state after rollback to the lease: %q, want the lease document", r.st.doc)
	}
}

// TestRetentionWithoutKeptDocument: a session of an older version (no kept document) is
// compacted only up to the first checkpoint.
func TestRetentionWithoutKeptDocument(t *testing.T) {
	r := newRig(t, 3)
	if err := os.Remove(filepath.Join(r.dir, baseStateFile)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		r.patch()
		r.checkpoint()
	}
	if r.st.base > r.s.ckpts[0].StateSeq {
		t.Fatalf("compacted to %d past the first checkpoint (seq %d)", r.st.base, r.s.ckpts[0].StateSeq)
	}
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: "1"}); err != nil {
		t.Fatal(err)
	}
}

// TestCommitPointBeforeSend is issue 12.1: when the first effect is sent the commit point is
// already durable; a commit that fails mid-way keeps it, and start-up finishes the commit
// with the same cut.
func TestCommitPointBeforeSend(t *testing.T) {
	r := newRig(t, 64)
	r.fx.hold()
	c2 := r.checkpoint()
	r.fx.hold() // after the latest checkpoint, before the commit: sent too
	var seen sessionMeta
	r.fx.onCommit = func(upto uint64) error {
		var err error
		seen, err = r.s.rec.readMeta()
		if err != nil {
			return err
		}
		return errors.New("connection reset")
	}
	if _, err := r.o.Commit(context.Background(), "sb"); err == nil {
		t.Fatal("commit with a failing send succeeded")
	}
	if seen.CommitAfter != c2 || seen.Committing == nil || seen.Committing.Upto != 2 {
		t.Fatalf("meta on disk at the first send: %+v, want commit point %s and a commit up to 2", seen, c2)
	}
	if _, err := r.s.rollbackTarget(api.RollbackRequest{To: c2}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("rollback across a half-sent commit: %v, want refused", err)
	}
	r.fx.hold() // after the commit began: not part of it
	r.fx.onCommit = nil
	r.reopen() // start-up resumes the commit in the background
	waitFor(t, func() bool { return r.fx.status(2) == "released" })
	waitFor(t, func() bool { m, _ := r.s.rec.readMeta(); return m.Committing == nil })
	if r.fx.status(3) != "held" {
		t.Fatalf("effect recorded after the commit began: %s, want held", r.fx.status(3))
	}
	r.s.mu.RLock()
	point := r.s.meta.CommitAfter
	r.s.mu.RUnlock()
	if point != c2 {
		t.Fatalf("commit point after resume: %q, want %s", point, c2)
	}
}

// TestCommitDoesNotBlockOnHungSend is issue 12.6: checkpoints, patches and rollbacks (after
// the commit point) go on while a commit's send hangs.
func TestCommitDoesNotBlockOnHungSend(t *testing.T) {
	r := newRig(t, 64)
	r.fx.hold()
	r.checkpoint()
	hung, release := make(chan struct{}), make(chan struct{})
	r.fx.onCommit = func(uint64) error { close(hung); <-release; return nil }
	done := make(chan error, 1)
	go func() { _, err := r.o.Commit(context.Background(), "sb"); done <- err }()
	<-hung
	ok := make(chan struct{})
	go func() {
		defer close(ok)
		r.patch()
		c := r.checkpoint()
		r.fx.hold()
		if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c}); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-ok:
	case <-time.After(5 * time.Second):
		t.Fatal("checkpoint, patch or rollback blocked behind a hung commit")
	}
	if r.fx.status(2) != "dropped" {
		t.Fatalf("effect after the new checkpoint: %s, want dropped", r.fx.status(2))
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.fx.status(1) != "released" || r.fx.sent[2] != 0 {
		t.Fatalf("after the commit: effect 1 %s, effect 2 sent %d times", r.fx.status(1), r.fx.sent[2])
	}
}

// TestRollbackIntentRedo is issue 12.2: a rollback that dies after its files were restored
// (state and effects not yet) is finished at start, before the sandbox runs.
func TestRollbackIntentRedo(t *testing.T) {
	for _, point := range []string{"rollback/after-effects", "rollback/after-files", "rollback/after-state", "rollback/before-clear", "rollback/after-thaw"} {
		t.Run(point, func(t *testing.T) {
			r := newRig(t, 64)
			c2 := r.checkpoint()
			r.patch()
			r.fx.hold()
			r.checkpoint()
			from := r.st.Seq()
			t.Cleanup(failpoint.Reset)
			if err := failpoint.Enable(point, "error"); err != nil {
				t.Fatal(err)
			}
			_, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2})
			if !errors.Is(err, failpoint.ErrInjected) {
				t.Fatalf("rollback = %v, want the injected failure", err)
			}
			failpoint.Reset()
			r.frz.set(true) // as a killed daemon leaves it
			r.reopen()
			if r.frz.isFrozen() {
				t.Fatal("sandbox still frozen after start-up")
			}
			if r.fs.files != c2 || r.fs.head != c2 || r.fs.unwritten || r.st.Seq() == from || r.fx.status(1) != "dropped" {
				t.Fatalf("after redo: files at %s (head %s, record unwritten %v), state seq %d (was %d), effect %s; want all at %s",
					r.fs.files, r.fs.head, r.fs.unwritten, r.st.Seq(), from, r.fx.status(1), c2)
			}
			if got := ids(r.s.ckpts); len(got) != 3 || r.s.head != c2 {
				t.Fatalf("checkpoints after redo: %v head %s, want all kept and the head at %s", got, r.s.head, c2)
			}
			if in, _ := r.s.intents.read(); in != nil || r.s.pending != nil {
				t.Fatalf("intent left after redo: %+v", in)
			}
			// The redo is done once: the state is not rolled back again.
			seq := r.st.Seq()
			r.reopen()
			if r.st.Seq() != seq {
				t.Fatal("second start redid the rollback")
			}
		})
	}
}

// TestRollbackPendingOnFullDisk: a rollback whose state step fails (ENOSPC) after the files
// were rewritten does not leave the sandbox torn for good: it is pending (patches and
// commits refused, nothing sent), and the next operation finishes it.
func TestRollbackPendingOnFullDisk(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	r.patch()
	r.fx.hold()
	r.st.failRB = syscall.ENOSPC
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("rollback on a full disk = %v", err)
	}
	if r.frz.isFrozen() {
		t.Fatal("sandbox left frozen")
	}
	if _, err := r.o.StatePatch(context.Background(), "sb", nil, nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("patch during a pending rollback = %v, want refused", err)
	}
	if _, err := r.o.Commit(context.Background(), "sb"); err != nil {
		t.Fatal(err)
	}
	if r.fx.sent[1] != 0 || r.fx.status(1) != "dropped" {
		t.Fatalf("rolled-back effect: %s, sent %d times", r.fx.status(1), r.fx.sent[1])
	}
	if r.s.pending != nil || r.st.Seq() == 0 {
		t.Fatal("the commit did not finish the pending rollback first")
	}
}

// TestRollbackRecordWrittenAfterThaw: the file store's record of a rollback is written after
// the thaw; until it is, the intent stays. When putting it in place fails (full disk), the sandbox
// runs (thawed), the rollback is pending, and the next checkpoint finishes it first: files
// again at the target, the record written, the intent cleared.
func TestRollbackRecordWrittenAfterThaw(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	r.patch()
	r.checkpoint()
	r.fs.failWrite = syscall.ENOSPC
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("rollback whose record cannot be written = %v", err)
	}
	r.s.bg.Wait()
	if r.frz.isFrozen() {
		t.Fatal("sandbox left frozen")
	}
	if in, _ := r.s.intents.read(); in == nil || r.s.pending == nil || !r.fs.unwritten {
		t.Fatalf("record not written, but intent %+v pending %v", in, r.s.pending)
	}
	r.fs.files = "dirty" // the sandbox ran meanwhile
	n := r.fs.rollbacks
	r.checkpoint()
	if r.fs.rollbacks != n+1 || r.s.pending != nil || r.fs.unwritten {
		t.Fatalf("checkpoint did not finish the rollback first: %d rollbacks (was %d), pending %v, unwritten %v",
			r.fs.rollbacks, n, r.s.pending, r.fs.unwritten)
	}
	if in, _ := r.s.intents.read(); in != nil {
		t.Fatalf("intent left: %+v", in)
	}
}

func TestLoadCheckpoints(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	// An older version's record file for a pack without a record in it.
	r.fs.ids = append(r.fs.ids, "3")
	legacy, _ := json.Marshal(ckptRecord{Checkpoint: api.Checkpoint{ID: "3", Level: api.LevelL1}})
	if err := os.WriteFile(filepath.Join(r.dir, "ckpt-3.json"), legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	// A stale record without a pack, and a pack without any record (crash mid-checkpoint).
	stale, _ := json.Marshal(ckptRecord{Checkpoint: api.Checkpoint{ID: "7", Level: api.LevelL1}})
	if err := os.WriteFile(filepath.Join(r.dir, "ckpt-7.json"), stale, 0o600); err != nil {
		t.Fatal(err)
	}
	r.fs.ids = append(r.fs.ids, "4")
	r.reopen()
	if got := ids(r.s.ckpts); len(got) != 3 || got[1] != c2 || got[2] != "3" {
		t.Fatalf("loaded %v, want [1 %s 3]", got, c2)
	}
	if len(r.fs.deleted) != 1 || r.fs.deleted[0] != "4" {
		t.Fatalf("deleted packs %v, want [4]", r.fs.deleted)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "ckpt-7.json")); !os.IsNotExist(err) {
		t.Fatal("stale record kept")
	}
}

func ids(cs []ckptRecord) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5 s")
		}
	}
}

// TestRollbackToDamagedCheckpointChangesNothing: a rollback whose target's stored contents
// are damaged is refused (data_loss, naming it) before any step: no process stopped, no
// effect dropped, nothing pending; the sandbox goes on, and other rollbacks work.
func TestRollbackToDamagedCheckpointChangesNothing(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	r.patch()
	r.fx.hold()
	seq := r.st.Seq()
	r.fs.failRoll = &overlay.DamageError{Checkpoint: c2, Path: "root/f", Reason: "xxh3 mismatch"}
	_, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2})
	if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), "checkpoint "+c2+" is damaged") {
		t.Fatalf("rollback to a damaged checkpoint = %v", err)
	}
	if r.s.pending != nil || r.fx.status(1) != "held" || r.st.Seq() != seq || r.frz.isFrozen() {
		t.Fatalf("refused rollback changed something: pending %v, effect %s, seq %d (was %d)", r.s.pending, r.fx.status(1), r.st.Seq(), seq)
	}
	if _, err := r.o.StatePatch(context.Background(), "sb", nil, nil); err != nil {
		t.Fatalf("patch after a refused rollback = %v", err)
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); err != nil {
		t.Fatalf("rollback once the damage is gone = %v", err)
	}
}

// TestAnsweredRollbackNotRedone: a rollback is answered once its record is in place (not
// yet synced); the syncs and the intent's clear follow in the background. A daemon killed
// before them finds, at start, the intent and a record naming it: it syncs the record and
// clears the intent without redoing the rollback, so what the sandbox did after the answer
// stays. A background sync that failed is retried by the next operation, before it runs.
func TestAnsweredRollbackNotRedone(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	r.patch()
	r.fx.hold()
	r.checkpoint()
	t.Cleanup(failpoint.Reset)
	if err := failpoint.Enable("rollback/before-sync", "error"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); err != nil {
		t.Fatal(err)
	}
	r.s.bg.Wait()
	if in, _ := r.s.intents.read(); in == nil || r.s.unsynced == nil || !r.fs.unsynced || r.fs.unwritten {
		t.Fatalf("after the answer, before the syncs: intent %+v, unsynced %v, record unsynced %v unwritten %v",
			in, r.s.unsynced, r.fs.unsynced, r.fs.unwritten)
	}
	failpoint.Reset()
	r.fs.files = "after-answer" // the sandbox ran on
	r.fx.hold()                 // and made a held effect (2)
	n, seq := r.fs.rollbacks, r.st.Seq()
	r.reopen() // killed
	if r.fs.rollbacks != n || r.fs.files != "after-answer" || r.fx.status(2) != "held" || r.st.Seq() != seq {
		t.Fatalf("an answered rollback was redone at start: rollbacks %d (was %d), files %s, effect 2 %s, state seq %d (was %d)",
			r.fs.rollbacks, n, r.fs.files, r.fx.status(2), r.st.Seq(), seq)
	}
	if in, _ := r.s.intents.read(); in != nil || r.fs.syncs != 1 || r.fs.unsynced || r.s.head != c2 {
		t.Fatalf("at start: intent %+v, record syncs %d (unsynced %v), head %s; want no intent, one sync, head %s",
			in, r.fs.syncs, r.fs.unsynced, r.s.head, c2)
	}
	// a failed background sync: the next checkpoint syncs first
	if err := failpoint.Enable("rollback/before-sync", "error"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); err != nil {
		t.Fatal(err)
	}
	r.s.bg.Wait()
	failpoint.Reset()
	r.checkpoint()
	if in, _ := r.s.intents.read(); in != nil || r.s.unsynced != nil || r.fs.unsynced {
		t.Fatalf("after the next checkpoint: intent %+v, unsynced %v / %v", in, r.s.unsynced, r.fs.unsynced)
	}
}

// TestRollbackWaitsForItsIntent: the intent's fdatasync runs while the sandbox is frozen
// and the files' rollback planned; nothing changes before it is durable: when it fails,
// the rollback is refused with nothing changed (no process killed, no effect dropped, no
// file written), the sandbox thawed and no intent left.
func TestRollbackWaitsForItsIntent(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	r.patch()
	r.fx.hold()
	r.checkpoint()
	n, seq := r.fs.rollbacks, r.st.Seq()
	t.Cleanup(failpoint.Reset)
	if err := failpoint.Enable("rollback/intent-sync", "error"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("rollback whose intent cannot be synced = %v", err)
	}
	failpoint.Reset()
	if r.fs.rollbacks != n || r.st.Seq() != seq || r.fx.status(1) != "held" || r.frz.isFrozen() {
		t.Fatalf("after a failed intent sync: rollbacks %d (was %d), state seq %d (was %d), effect %s, frozen %v",
			r.fs.rollbacks, n, r.st.Seq(), seq, r.fx.status(1), r.frz.isFrozen())
	}
	if in, _ := r.s.intents.read(); in != nil || r.s.pending != nil {
		t.Fatalf("intent left after a refused rollback: %+v (pending %v)", in, r.s.pending)
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); err != nil {
		t.Fatal(err)
	}
	if r.fx.status(1) != "dropped" || r.s.head != c2 {
		t.Fatalf("the next rollback: effect %s, head %s", r.fx.status(1), r.s.head)
	}
}

// TestRollbackPreparedBeforeFreeze: the files' rollback is worked out before the freeze and
// applied inside it; a rollback that stops before the files (here in its frozen window)
// aborts the preparation, so the file store is released and changes nothing, and the
// rollback's redo prepares anew.
func TestRollbackPreparedBeforeFreeze(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	r.patch()
	r.checkpoint()
	var frozenAtPrepare, frozenAtApply []bool
	r.fs.onPrepare = func() { frozenAtPrepare = append(frozenAtPrepare, r.frz.isFrozen()) }
	r.fs.onApply = func() { frozenAtApply = append(frozenAtApply, r.frz.isFrozen()) }
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(frozenAtPrepare, []bool{false}) || !slices.Equal(frozenAtApply, []bool{true}) || r.fs.aborted != 0 || r.fs.files != c2 {
		t.Fatalf("prepared while frozen: %v, applied while frozen: %v, aborted %d, files at %s; want prepared before the freeze and applied in it",
			frozenAtPrepare, frozenAtApply, r.fs.aborted, r.fs.files)
	}

	r.patch()
	c3 := r.checkpoint()
	r.fs.files = "dirty"
	t.Cleanup(failpoint.Reset)
	if err := failpoint.Enable("rollback/frozen", "1*error"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("rollback = %v, want the injected failure", err)
	}
	if r.fs.aborted != 1 || r.fs.files != "dirty" || r.frz.isFrozen() {
		t.Fatalf("a rollback stopped in its window: %d preparations aborted, files at %s, frozen %v; want 1, untouched, thawed",
			r.fs.aborted, r.fs.files, r.frz.isFrozen())
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c3}); err != nil { // redoes the pending one first
		t.Fatal(err)
	}
	if r.fs.prepared != 4 || r.fs.files != c3 {
		t.Fatalf("%d preparations, files at %s; want 4 (the redo prepares too) and at %s", r.fs.prepared, r.fs.files, c3)
	}
}

// TestBackgroundStepLetsReadersOn: a rollback's background step (its record's syncs, here
// made slow with failpoint rollback/before-sync) holds the session lock shared: a state
// patch and a listing right after the answer go on while it runs, a checkpoint waits for
// it and then finds the rollback durable.
func TestBackgroundStepLetsReadersOn(t *testing.T) {
	r := newRig(t, 64)
	c2 := r.checkpoint()
	r.patch()
	r.checkpoint()
	t.Cleanup(failpoint.Reset)
	if err := failpoint.Enable("rollback/before-sync", "sleep(400)"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the background step has the lock and sleeps
	start := time.Now()
	r.patch()
	if _, err := r.o.Checkpoints(context.Background(), "sb"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("a state patch and a listing during the rollback's background syncs took %v: they waited for them", d)
	}
	r.checkpoint()
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("a checkpoint during the rollback's background syncs took %v: it did not wait for them", d)
	}
	if in, _ := r.s.intents.read(); in != nil || r.s.unsynced != nil || r.fs.unsynced {
		t.Fatalf("after the checkpoint: intent %+v, unsynced %v / %v", in, r.s.unsynced, r.fs.unsynced)
	}
}
