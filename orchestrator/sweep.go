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
	// The proxy keeps one <sandbox>.journal per sandbox in its state directory.
	journals, _ := os.ReadDir(filepath.Join(o.opts.Root, "proxy", "journal"))
	for _, j := range journals {
		id, ok := strings.CutSuffix(j.Name(), ".journal")
		if !ok || leased[id] {
			continue
		}
		log.L(ctx).Info("removing the effect journal of a sandbox that is no longer leased", "sandbox", id)
		if err := o.effects.Forget(ctx, id); err != nil {
			log.L(ctx).Warn("remove effect journal", "sandbox", id, "error", err)
		}
	}
	for _, sub := range []string{"restore", "criu-work"} {
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
