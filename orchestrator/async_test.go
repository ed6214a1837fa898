package orchestrator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestAsyncCheckpointReturnsBeforeDurabilityAndRollbackWaits: an asynchronous checkpoint
// returns while its record is still being written (a 300 ms commit), and a rollback to it
// issued right away waits for the write and then finds it.
func TestAsyncCheckpointReturnsBeforeDurabilityAndRollbackWaits(t *testing.T) {
	r := newRig(t, 64)
	t.Cleanup(failpoint.Reset)
	if err := failpoint.Enable("checkpoint/before-commit", "1*sleep(300)"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	ck, err := r.o.checkpoint(ctx, r.s, api.CheckpointRequest{Async: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("asynchronous checkpoint returned after %s, not before its 300 ms commit", d)
	}
	if _, err := r.o.Rollback(ctx, "sb", api.RollbackRequest{To: ck.ID}); err != nil {
		t.Fatalf("rollback right after an asynchronous checkpoint: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("the rollback did not wait for the commit (%s)", d)
	}
}

// TestAsyncCheckpointFailureReachesTheNextOperation: a failed background commit is not
// lost: the next operation on the sandbox returns it (once), and the checkpoint is absent.
func TestAsyncCheckpointFailureReachesTheNextOperation(t *testing.T) {
	r := newRig(t, 64)
	t.Cleanup(failpoint.Reset)
	if err := failpoint.Enable("checkpoint/before-commit", "1*error"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ck, err := r.o.checkpoint(ctx, r.s, api.CheckpointRequest{Async: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.o.checkpoint(ctx, r.s, api.CheckpointRequest{})
	if !errors.Is(err, errdefs.ErrAborted) {
		t.Fatalf("next checkpoint: %v, want the asynchronous checkpoint's failure", err)
	}
	if r.s.find(ck.ID) >= 0 {
		t.Fatalf("checkpoint %s is listed although its commit failed", ck.ID)
	}
	if _, err := r.o.checkpoint(ctx, r.s, api.CheckpointRequest{}); err != nil {
		t.Fatalf("the failure is reported once: %v", err)
	}
}
