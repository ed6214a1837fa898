package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"path"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/state"
)

// Diff reports what changed between checkpoints from and to ("" = now): files, state ops and
// effects. from defaults to the latest checkpoint.
func (o *Orchestrator) Diff(ctx context.Context, id, from, to string) (api.Diff, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.Diff{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if from == "" {
		from = s.latest().ID
	}
	fi, ti := s.find(from), len(s.ckpts)
	if to != "" {
		ti = s.find(to)
	}
	if fi < 0 || ti < 0 {
		return api.Diff{}, fmt.Errorf("checkpoint %q or %q of sandbox %q: %w", from, to, id, errdefs.ErrNotFound)
	}
	if ti < fi {
		return api.Diff{}, fmt.Errorf("diff from %s to %s goes backwards: %w", from, to, errdefs.ErrInvalidArgument)
	}
	d := api.Diff{ID: id, From: from, To: to}
	if d.Files, err = s.fileDiff(ctx, from, to); err != nil {
		return d, err
	}
	toSeq, toWM := s.state.Seq(), uint64(0)
	if to != "" {
		toSeq, toWM = s.ckpts[ti].StateSeq, s.ckpts[ti].EffectsWatermark
	}
	if d.State, err = s.stateLog(s.ckpts[fi].StateSeq, toSeq); err != nil {
		return d, err
	}
	d.Effects, err = o.effects.List(ctx, id, s.ckpts[fi].EffectsWatermark, toWM)
	return d, err
}

func (s *session) fileDiff(ctx context.Context, from, to string) ([]api.FileChange, error) {
	entries, err := s.fs.Diff(ctx, from, to)
	if err != nil {
		return nil, err
	}
	out := make([]api.FileChange, 0, len(entries))
	for _, e := range entries {
		out = append(out, api.FileChange{Path: path.Join("/", e.Path), Change: string(e.Change), Kind: string(e.Kind), Size: e.Size})
	}
	return out, nil
}

func (s *session) stateLog(from, to uint64) ([]api.StateEntry, error) {
	entries, err := s.state.Log(from, to)
	if err != nil {
		return nil, err
	}
	out := make([]api.StateEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, stateEntry(e))
	}
	return out, nil
}

func stateEntry(e state.Entry) api.StateEntry {
	se := api.StateEntry{Seq: e.Seq, Checkpoint: e.Checkpoint, Time: e.Time}
	se.Op, _ = json.Marshal(e.Op)
	for _, inv := range e.Inverse {
		data, _ := json.Marshal(inv)
		se.Inverse = append(se.Inverse, data)
	}
	return se
}

// StateGet returns the sandbox's state document, or the value at pointer.
func (o *Orchestrator) StateGet(ctx context.Context, id, pointer string) (json.RawMessage, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.state.Get(pointer)
}

// StatePatch applies a patch (all ops or none); ifSeq, when set, makes it fail with conflict
// if the document has moved past that sequence number.
func (o *Orchestrator) StatePatch(ctx context.Context, id string, ops []state.Op, ifSeq *uint64) (api.StatePatchResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.StatePatchResult{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.pending != nil { // its redo checks that the state did not move
		return api.StatePatchResult{}, fmt.Errorf("sandbox %q has a pending rollback to %s: roll back or checkpoint to finish it: %w",
			id, s.pending.Target, errdefs.ErrFailedPrecondition)
	}
	res, err := s.state.Patch(ctx, ops, state.PatchOptions{IfSeq: ifSeq, Checkpoint: s.latest().ID})
	if err != nil {
		return api.StatePatchResult{}, fmt.Errorf("patch state of %q: %w", id, err)
	}
	return api.StatePatchResult{Seq: res.Seq, Applied: res.Applied}, nil
}

// StateLog returns the logged state ops with from < seq <= to (to == 0: up to now).
func (o *Orchestrator) StateLog(ctx context.Context, id string, from, to uint64) ([]api.StateEntry, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return nil, err
	}
	if to == 0 {
		to = s.state.Seq()
	}
	return s.stateLog(from, to)
}
