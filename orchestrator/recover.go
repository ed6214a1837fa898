package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/state"
)

// recover finishes, at start, what a crash interrupted: a rollback whose intent is still
// recorded is redone (the sandbox was left frozen), and a commit in progress is resumed in
// the background. Otherwise the sandbox is thawed (a crash during a checkpoint leaves it
// frozen).
func (o *Orchestrator) recover(ctx context.Context, s *session) error {
	in, err := s.intents.read()
	if err != nil {
		return err
	}
	if in != nil && in.ID != "" && in.ID == s.headRollback {
		// Answered before the crash: its record, in place, names it (settleAnswered). It is
		// made durable, not redone: the sandbox may have run on since the answer.
		if err := s.fs.SyncRollback(); err != nil {
			return err
		}
		if err := s.intents.clear(); err != nil {
			return err
		}
		log.L(ctx).Info("answered rollback made durable", "checkpoint", in.Target)
		in = nil
	}
	if in == nil {
		if err := s.frz.Thaw(); err != nil {
			return err
		}
	} else {
		s.pending = in
		if err := o.finishPending(ctx, s); err != nil {
			// The sandbox runs (no sandbox stays frozen); its checkpoint operations finish
			// the rollback first and fail while it cannot be finished.
			log.L(ctx).Error("redo interrupted rollback", "checkpoint", in.Target, "error", err)
		} else {
			log.L(ctx).Info("interrupted rollback finished", "checkpoint", in.Target)
		}
	}
	if s.meta.Committing != nil {
		go o.resumeCommit(ctx, s)
	}
	return nil
}

// baseState is the agent state of a session's first checkpoint, kept aside: retention
// compacts the state log past it, and the first checkpoint is always kept.
type baseState struct {
	Seq uint64          `json:"seq"`
	Doc json.RawMessage `json:"doc"`
}

const baseStateFile = "base-state.json"

// saveBaseState records the current document as the first checkpoint's.
func (s *session) saveBaseState() error {
	doc, err := s.state.Get("")
	if err != nil {
		return err
	}
	data, err := json.Marshal(baseState{Seq: s.state.Seq(), Doc: doc})
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(s.dir, baseStateFile), data, 0o600); err != nil {
		return fmt.Errorf("record the lease state: %w", err)
	}
	return nil
}

func (s *session) readBaseState() (*baseState, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, baseStateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var b baseState
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("%s: %w", baseStateFile, err)
	}
	return &b, nil
}

// hasBaseState reports whether the kept document is the state at seq.
func (s *session) hasBaseState(seq uint64) bool {
	b, err := s.readBaseState()
	return err == nil && b != nil && b.Seq == seq
}

// restoreBaseState replaces the document with the kept first-checkpoint document (a patch:
// the log no longer holds the ops to undo).
func (s *session) restoreBaseState(ctx context.Context) (int, error) {
	b, err := s.readBaseState()
	if err != nil {
		return 0, err
	}
	if b == nil {
		return 0, fmt.Errorf("the lease state is not kept")
	}
	doc := b.Doc
	if len(doc) == 0 {
		doc = json.RawMessage("null")
	}
	if _, err := s.state.Patch(ctx, []state.Op{{Op: state.OpReplace, Path: "", Value: doc}}, state.PatchOptions{}); err != nil {
		return 0, err
	}
	return 1, nil
}
