package orchestrator

import (
	"context"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Effects is the egress proxy's half of the checkpoint protocol: every checkpoint records the
// sandbox's effect-journal watermark, a rollback drops (or compensates) what came after it,
// and a commit releases what is held.
type Effects interface {
	// SetCheckpoint tags effects recorded from now on with checkpoint ckpt.
	SetCheckpoint(sandbox, ckpt string)
	// Watermark is the sequence number of the sandbox's latest journaled effect.
	Watermark(sandbox string) uint64
	// Rollback drops held effects after watermark and compensates compensable ones.
	Rollback(ctx context.Context, sandbox string, watermark uint64) (dropped int, err error)
	// Commit sends every held effect in order, exactly once.
	Commit(ctx context.Context, sandbox string) (released, failed int, err error)
	// List returns the sandbox's effects with from < seq <= to (to == 0: no upper bound).
	List(sandbox string, from, to uint64) []api.Effect
	// Forget drops a released sandbox's journal.
	Forget(sandbox string)
}

// noEffects is the Effects of a node without an egress proxy: nothing is ever held.
type noEffects struct{}

func (noEffects) SetCheckpoint(string, string)                          {}
func (noEffects) Watermark(string) uint64                               { return 0 }
func (noEffects) Rollback(context.Context, string, uint64) (int, error) { return 0, nil }
func (noEffects) Commit(context.Context, string) (int, int, error)      { return 0, 0, nil }
func (noEffects) List(string, uint64, uint64) []api.Effect              { return nil }
func (noEffects) Forget(string)                                         {}
