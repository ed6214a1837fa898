package orchestrator

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Verify checks a sandbox's consistency: the agent state rebuilt from its last snapshot plus
// the log must equal the live document, and (when ckpt is the latest checkpoint, or "") the
// files recorded for the checkpoint must equal a full walk of the merged tree.
func (o *Orchestrator) Verify(ctx context.Context, id, ckpt string) (api.VerifyResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.VerifyResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ckpt == "" {
		ckpt = s.latest().ID
	}
	if s.find(ckpt) < 0 {
		return api.VerifyResult{}, fmt.Errorf("checkpoint %q of sandbox %q: %w", ckpt, id, errdefs.ErrNotFound)
	}
	res := api.VerifyResult{ID: id, Checkpoint: ckpt}
	if err := s.state.Verify(ctx); err != nil {
		res.Problems = append(res.Problems, "state: "+err.Error())
	}
	problems, err := o.verifyFiles(ctx, s, ckpt)
	if err != nil {
		return res, err
	}
	res.Problems = append(res.Problems, problems...)
	res.OK = len(res.Problems) == 0
	return res, nil
}

// verifyFiles reports paths whose state differs from what checkpoint ckpt recorded.
func (o *Orchestrator) verifyFiles(ctx context.Context, s *session, ckpt string) ([]string, error) {
	changes, err := s.fs.Diff(ctx, ckpt, "")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range changes {
		out = append(out, fmt.Sprintf("files: /%s %s since checkpoint %s", c.Path, c.Change, ckpt))
	}
	return out, nil
}
