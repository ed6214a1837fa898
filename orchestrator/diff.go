package orchestrator

import (
	"context"
	"path"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Diff reports what changed between checkpoints from and to ("" = now; both references):
// files, state ops and effects. from defaults to the head. Files compare across branches too;
// state ops and effects are listed only when from is an ancestor of to (they are the ops the
// checkpoint records kept on the way, then those since the head), else they are empty.
func (o *Orchestrator) Diff(ctx context.Context, id, from, to string) (api.Diff, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.Diff{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if from == "" {
		from = refHead
	}
	fi, err := s.resolve(from)
	if err != nil {
		return api.Diff{}, err
	}
	from, ti := s.ckpts[fi].ID, len(s.ckpts)
	if to != "" {
		if ti, err = s.resolve(to); err != nil {
			return api.Diff{}, err
		}
		to = s.ckpts[ti].ID
	}
	toID := s.head
	if to != "" {
		toID = to
	}
	d := api.Diff{ID: id, From: from, To: to}
	if d.Files, err = s.fileDiff(ctx, from, to); err != nil {
		return d, err
	}
	if s.isAncestor(from, toID) {
		if d.State, err = s.stateOpsBetween(from, toID, to == ""); err != nil {
			return d, err
		}
		toWM := uint64(0)
		if to != "" {
			toWM = s.ckpts[ti].EffectsWatermark
		}
		d.Effects, err = o.effects.List(ctx, id, s.ckpts[fi].EffectsWatermark, toWM)
	}
	if d.State == nil { // lists are [] on the wire, never null
		d.State = []api.StateEntry{}
	}
	if d.Effects == nil {
		d.Effects = []api.Effect{}
	}
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
