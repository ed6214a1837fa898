package orchestrator

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/deltabox/deltabox/internal/log"
)

// sweep removes, at start, what interrupted operations left behind: the session
// directories and effect journals of sandboxes that are no longer leased (a release killed
// between the pool's release and the session's end), restore staging directories and CRIU
// work directories (no restore or dump runs before start-up is done).
func (o *Orchestrator) sweep(ctx context.Context, leased map[string]bool) {
	dirs, _ := os.ReadDir(filepath.Join(o.opts.Root, "sandboxes"))
	for _, d := range dirs {
		if !leased[d.Name()] {
			log.L(ctx).Info("removing state of a sandbox that is no longer leased", "sandbox", d.Name())
			_ = os.RemoveAll(filepath.Join(o.opts.Root, "sandboxes", d.Name()))
		}
	}
	// The proxy keeps one <sandbox>.journal per sandbox in its state directory. Removing
	// one waits for a commit the proxy may be resuming, so it runs in the background.
	journals, _ := os.ReadDir(filepath.Join(o.opts.Root, "proxy", "journal"))
	var gone []string
	for _, j := range journals {
		if id, ok := strings.CutSuffix(j.Name(), ".journal"); ok && !leased[id] {
			gone = append(gone, id)
		}
	}
	if len(gone) > 0 {
		go o.forgetJournals(context.WithoutCancel(ctx), gone)
	}
	for _, sub := range []string{restoreDiskDir, restoreMemDir, "criu-work"} {
		entries, _ := os.ReadDir(filepath.Join(o.opts.Root, sub))
		for _, e := range entries {
			p := filepath.Join(o.opts.Root, sub, e.Name())
			log.L(ctx).Info("removing what an interrupted operation left", "path", p)
			if err := os.RemoveAll(p); err != nil {
				log.L(ctx).Warn("remove leftover", "path", p, "error", err)
			}
		}
	}
}

// forgetJournals removes the effect journals of sandboxes that are no longer leased.
func (o *Orchestrator) forgetJournals(ctx context.Context, ids []string) {
	for _, id := range ids {
		log.L(ctx).Info("removing the effect journal of a sandbox that is no longer leased", "sandbox", id)
		if err := o.effects.Forget(ctx, id); err != nil {
			log.L(ctx).Warn("remove effect journal", "sandbox", id, "error", err)
		}
	}
}
