package orchestrator

import (
	"context"
	"io"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Effects is the egress proxy's half of the checkpoint protocol: every checkpoint records the
// sandbox's effect-journal watermark, a rollback drops (or compensates) what came after it,
// and a commit releases what is held up to the watermark its commit point recorded.
type Effects interface {
	// SetCheckpoint tags effects recorded from now on with checkpoint ckpt.
	SetCheckpoint(ctx context.Context, sandbox, ckpt string) error
	// Watermark is the sequence number of the sandbox's latest journaled effect.
	Watermark(sandbox string) uint64
	// Rollback drops held effects after watermark and compensates compensable ones.
	Rollback(ctx context.Context, sandbox string, watermark uint64) (dropped int, err error)
	// Commit sends every held effect with seq <= upto in order, each with a stable
	// Idempotency-Key: delivery is at least once, so exactly once at an upstream that honours
	// the key. Calling it again with the same upto finishes an interrupted commit.
	Commit(ctx context.Context, sandbox string, upto uint64) (released, failed int, err error)
	// List returns the sandbox's effects with from < seq <= to (to == 0: no upper bound).
	List(ctx context.Context, sandbox string, from, to uint64) ([]api.Effect, error)
	// Forget drops a released sandbox's journal.
	Forget(ctx context.Context, sandbox string) error
}

// noEffects is the Effects of a node without an egress proxy: nothing is ever held.
type noEffects struct{}

func (noEffects) SetCheckpoint(context.Context, string, string) error                { return nil }
func (noEffects) Watermark(string) uint64                                            { return 0 }
func (noEffects) Rollback(context.Context, string, uint64) (int, error)              { return 0, nil }
func (noEffects) Commit(context.Context, string, uint64) (int, int, error)           { return 0, 0, nil }
func (noEffects) List(context.Context, string, uint64, uint64) ([]api.Effect, error) { return nil, nil }
func (noEffects) Forget(context.Context, string) error                               { return nil }

// effectsBlob writes the sandbox's effects as JSON (a snapshot's effects layer).
func (o *Orchestrator) effectsBlob(ctx context.Context, id string) func(io.Writer) error {
	return func(w io.Writer) error {
		all, err := o.effects.List(ctx, id, 0, 0)
		if err != nil {
			return err
		}
		return jsonBlob(all)(w)
	}
}
