package orchestrator

import (
	"context"
	"fmt"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Verify checks a sandbox's consistency: the agent state rebuilt from its last snapshot plus
// the log must equal the live document, the files recorded for checkpoint ckpt (default: the
// latest) must equal a full walk of the merged tree, and every stored checkpoint's contents
// must still match their digests (a damaged one is named, with the path, and so is one set
// aside as damaged when the sandbox's session was opened).
func (o *Orchestrator) Verify(ctx context.Context, id, ckpt string) (api.VerifyResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.VerifyResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ckpt == "" {
		ckpt = refHead
	}
	i, err := s.resolve(ckpt)
	if err != nil {
		return api.VerifyResult{}, err
	}
	ckpt = s.ckpts[i].ID
	res := api.VerifyResult{ID: id, Checkpoint: ckpt}
	if err := s.state.Verify(ctx); err != nil {
		res.Problems = append(res.Problems, "state: "+err.Error())
	}
	problems, err := o.verifyFiles(ctx, s, ckpt)
	if err != nil {
		return res, err
	}
	res.Problems = append(res.Problems, problems...)
	damaged, err := s.fs.Scrub(ctx)
	if err != nil {
		return res, err
	}
	for _, d := range damaged {
		res.Problems = append(res.Problems, "checkpoints: "+d.String())
	}
	res.OK = len(res.Problems) == 0
	return res, nil
}

// verifyFiles compares what checkpoint ckpt recorded with a full walk of the merged tree
// (the sandbox's mount points and the /.deltabox bind mounts are skipped), path by path.
func (o *Orchestrator) verifyFiles(ctx context.Context, s *session, ckpt string) ([]string, error) {
	merged, closeRoot, err := s.merged()
	if err != nil {
		return nil, err
	}
	mismatches, err := s.fs.Verify(ctx, ckpt, merged)
	closeRoot()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mismatches {
		out = append(out, fmt.Sprintf("files: %s: want %s, got %s", m.Path, m.Want, m.Got))
	}
	return out, nil
}
