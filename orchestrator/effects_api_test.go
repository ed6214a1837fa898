package orchestrator

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// failingEffects fails every effect a commit sends, as a proxy does once the attempts are
// used up.
type failingEffects struct{ *fakeEffects }

func (f failingEffects) Commit(_ context.Context, _ string, upto uint64) (int, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for i := range f.effects {
		if x := &f.effects[i]; x.Seq <= upto && x.Status == "held" {
			x.ID, x.Status, x.Attempts, x.Error = "eff-failing", "failed", 3, "upstream answered 503"
			n++
		}
	}
	return 0, n, nil
}

func TestCommitWithFailedEffectsIsAnError(t *testing.T) {
	r := newRig(t, 64)
	r.o.effects = failingEffects{r.fx}
	r.fx.hold()
	c := r.checkpoint()
	res, err := r.o.Commit(context.Background(), "sb")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "eff-failing") ||
		!strings.Contains(err.Error(), "upstream answered 503") || res.EffectsFailed != 1 {
		t.Fatalf("commit: %+v %v, want an error naming the failed effect", res, err)
	}
	meta, err := r.s.rec.readMeta()
	if err != nil || meta.CommitAfter != c || meta.Committing != nil {
		t.Fatalf("commit point %+v %v: it must move to %s and the commit be finished", meta, err, c)
	}
}
