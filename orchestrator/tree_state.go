package orchestrator

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/state"
)

// The agent state across the tree. The state log is linear: a rollback to a checkpoint
// whose document is still a point of the log undoes the ops after it (state.RollbackTo).
// A checkpoint on another branch is no longer on the log (its ops were undone when the
// sandbox left its branch), so every checkpoint record keeps the ops from its parent to it
// with their inverses (StateOps): the target's document is rebuilt from the current one by
// undoing the ops since the head, the head's path up to the common ancestor, and replaying
// the ops down to the target, then written as one patch replacing the document.

// canRebuild checks that every record a rebuild for in needs has its state ops and that the
// log still holds the ops since the head.
func (s *session) canRebuild(in rollbackIntent) error {
	if _, err := s.state.Log(in.FromSeq, in.StateFrom); err != nil {
		return err
	}
	up, _, down := s.pathBetween(in.From, in.Target)
	for _, id := range append(up, down...) {
		if c := s.ckpts[s.find(id)]; !c.TreeOps {
			return fmt.Errorf("checkpoint %s was recorded by an earlier version without its state ops: %w", id, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// docFor returns the document of checkpoint target, computed from the current document
// (at state seq cur) when the sandbox's head is from, whose document is at seq fromSeq, and
// how many ops it undid and replayed.
func (s *session) docFor(from string, fromSeq, cur uint64, target string) (*state.Doc, int, error) {
	raw, err := s.state.Get("")
	if err != nil {
		return nil, 0, err
	}
	doc, err := state.NewDoc(raw)
	if err != nil {
		return nil, 0, err
	}
	live, err := s.state.Log(fromSeq, cur)
	if err != nil {
		return nil, 0, err
	}
	if err := doc.Undo(live); err != nil {
		return nil, 0, fmt.Errorf("undo the ops since checkpoint %s: %w", from, err)
	}
	n := len(live)
	up, _, down := s.pathBetween(from, target)
	for _, id := range up {
		c := s.ckpts[s.find(id)]
		if err := doc.Undo(c.StateOps); err != nil {
			return nil, 0, fmt.Errorf("undo the state ops of checkpoint %s: %w", id, err)
		}
		n += len(c.StateOps)
	}
	for _, id := range down {
		c := s.ckpts[s.find(id)]
		if err := doc.Redo(c.StateOps); err != nil {
			return nil, 0, fmt.Errorf("replay the state ops of checkpoint %s: %w", id, err)
		}
		n += len(c.StateOps)
	}
	return doc, n, nil
}

// rebuildState writes the target's rebuilt document (one patch) and returns how many ops it
// undid and replayed.
func (s *session) rebuildState(ctx context.Context, in rollbackIntent) (int, error) {
	doc, n, err := s.docFor(in.From, in.FromSeq, in.StateFrom, in.Target)
	if err != nil {
		return 0, err
	}
	raw, err := doc.JSON()
	if err != nil {
		return 0, err
	}
	if _, err := s.state.Patch(ctx, []state.Op{{Op: state.OpReplace, Path: "", Value: raw}}, state.PatchOptions{Checkpoint: in.Target}); err != nil {
		return 0, fmt.Errorf("write the state of checkpoint %s: %w", in.Target, err)
	}
	return n, nil
}

// stateAt returns the document (or the value at pointer p of it) as of checkpoint index i,
// without moving the sandbox. The caller holds s.mu.
func (s *session) stateAt(i int, p string) ([]byte, error) {
	c := s.ckpts[i]
	var doc *state.Doc
	if s.state.Has(c.StateSeq) {
		raw, err := s.state.Get("")
		if err != nil {
			return nil, err
		}
		if doc, err = state.NewDoc(raw); err != nil {
			return nil, err
		}
		ops, err := s.state.Log(c.StateSeq, s.state.Seq())
		if err != nil {
			return nil, err
		}
		if err := doc.Undo(ops); err != nil {
			return nil, err
		}
	} else {
		if err := s.canRebuild(rollbackIntent{From: s.head, FromSeq: s.headSeq, StateFrom: s.state.Seq(), Target: c.ID}); err != nil {
			return nil, fmt.Errorf("agent state of checkpoint %s is no longer available: %w", c.ID, err)
		}
		var err error
		if doc, _, err = s.docFor(s.head, s.headSeq, s.state.Seq(), c.ID); err != nil {
			return nil, err
		}
	}
	return doc.Get(p)
}

// stateOpsBetween lists the state ops from checkpoint from down to its descendant to (the
// ops the records on the way keep), and with live the ops since the head (to is the head).
func (s *session) stateOpsBetween(from, to string, live bool) ([]api.StateEntry, error) {
	out := []api.StateEntry{}
	_, _, down := s.pathBetween(from, to)
	for _, id := range down {
		for _, e := range s.ckpts[s.find(id)].StateOps {
			out = append(out, stateEntry(e))
		}
	}
	if live {
		since, err := s.stateLog(s.headSeq, s.state.Seq())
		if err != nil {
			return nil, err
		}
		out = append(out, since...)
	}
	return out, nil
}
