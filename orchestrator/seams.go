package orchestrator

import (
	"context"
	"encoding/json"
	"io"

	"github.com/deltabox/deltabox/orchestrator/state"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
)

// The seams of a session: the checkpoint protocol (checkpoint, rollback, commit, retention,
// recovery at start) is written against these small interfaces, so that its rules are tested
// with fakes, without root. The daemon uses pool.Freezer, overlay.Store (through
// overlayFiles) and state.Store.

// freezer freezes and thaws one sandbox's processes.
type freezer interface {
	Freeze(ctx context.Context) error
	Pin(skip map[int]bool) *pool.Pinned // the processes but skip, held by pidfds (session.freeze)
	Thaw() error
	Procs() ([]pool.Proc, error)
	ProcsExcept(skip map[int]bool) ([]pool.Proc, error) // Procs without skip
	Park(pid int) error                                 // out of the sandbox's freezing (pool.ErrCannotPark)
	Adopt(pid int) error                                // back in
	Kill(pids []int) int                                // SIGKILL through pidfds, members of the sandbox only
}

// fileStore keeps a sandbox's file checkpoints (overlay.Store).
type fileStore interface {
	Checkpoints() []string
	Meta(id string) ([]byte, error)
	Head() string
	HeadMeta() []byte
	Prepare(ctx context.Context, req overlay.CaptureRequest) (pendingFiles, error)
	Rollback(ctx context.Context, req overlay.RollbackRequest) (*overlay.RollbackResult, error)
	PrepareRollback(ctx context.Context, req overlay.RollbackRequest) (preparedFiles, error) // worked out before the freeze
	PersistRollback() error                                                                  // makes a Deferred rollback's record durable
	WriteRollback() error                                                                    // puts a Deferred rollback's record in place, without syncing it
	SyncRollback() error                                                                     // makes the record on disk durable (at start)
	Delete(ctx context.Context, id string, merge ...overlay.MetaMerge) error
	PrepareFold(ctx context.Context, ids []string, merge overlay.MetaMerge) (preparedFold, error) // Delete of inner checkpoints, worked out unlocked
	PrepareCompact(ctx context.Context, id string) (preparedFold, error)                          // makes id self-contained, worked out unlocked (nil: it is)
	Entries(id string) int                                                                        // how many entries checkpoint id records
	Diff(ctx context.Context, from, to string) ([]overlay.DiffEntry, error)
	Export(ctx context.Context, id string, w io.Writer) error
	ReadFile(ctx context.Context, id, path string, w io.Writer) (overlay.FileInfo, error)
	RestoreInto(ctx context.Context, id string, req overlay.RollbackRequest) (*overlay.RollbackResult, error)
	WriteLower(ctx context.Context, id string, req overlay.LowerRequest) (*overlay.LowerResult, error)
	LowerSize(id string) (int64, error)
	Verify(ctx context.Context, id, merged string, opts ...overlay.VerifyOption) ([]overlay.Mismatch, error)
	Scrub(ctx context.Context) ([]overlay.Damage, error)
	Close() error
}

// pendingFiles is a prepared file capture, committed with the checkpoint record or aborted.
type pendingFiles interface {
	Changed() (files int, bytes int64)
	Commit(meta []byte) (*overlay.CaptureResult, error)
	Abort()
}

// preparedFiles is a files' rollback worked out before the freeze, applied in the window (its
// plan checked first, and worked out again if the sandbox moved it) or aborted.
type preparedFiles interface {
	Rollback(ctx context.Context, open overlay.OpenFiles, beforeWrite func() error) (*overlay.RollbackResult, error)
	Abort()
}

// preparedFold is a fold of checkpoints into their child worked out without holding the
// store (retain.go): installed by Commit, made durable by Finish, or aborted.
type preparedFold interface {
	Commit(ctx context.Context) error
	Finish() error
	Abort()
}

// overlayFiles is the daemon's fileStore.
type overlayFiles struct{ *overlay.Store }

func (f overlayFiles) Prepare(ctx context.Context, req overlay.CaptureRequest) (pendingFiles, error) {
	p, err := f.Store.Prepare(ctx, req)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (f overlayFiles) PrepareRollback(ctx context.Context, req overlay.RollbackRequest) (preparedFiles, error) {
	p, err := f.Store.PrepareRollback(ctx, req)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (f overlayFiles) PrepareFold(ctx context.Context, ids []string, merge overlay.MetaMerge) (preparedFold, error) {
	p, err := f.Store.PrepareFold(ctx, ids, merge)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (f overlayFiles) PrepareCompact(ctx context.Context, id string) (preparedFold, error) {
	p, err := f.Store.PrepareCompact(ctx, id)
	if err != nil || p == nil {
		return nil, err
	}
	return p, nil
}

// stateStore keeps a sandbox's agent state (state.Store).
type stateStore interface {
	Seq() uint64
	Get(pointer string) (json.RawMessage, error)
	Patch(ctx context.Context, ops []state.Op, opt state.PatchOptions) (state.PatchResult, error)
	RollbackTo(ctx context.Context, seq uint64) (int, error)
	Has(seq uint64) bool
	Log(from, to uint64) ([]state.Entry, error)
	Compact(ctx context.Context, keep uint64) error
	Verify(ctx context.Context) error
	Close() error
}

var (
	_ freezer    = pool.Freezer{}
	_ fileStore  = overlayFiles{}
	_ stateStore = (*state.Store)(nil)
)
