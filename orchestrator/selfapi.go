package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/rootfs"
)

// SelfSocket is the name of the per-sandbox API socket in the sandbox's run directory; inside
// the sandbox it is /.deltabox/run/api.sock.
const SelfSocket = "api.sock"

// selfHandler serves a sandbox its own checkpoint, rollback, diff, state and verify routes
// under /v1/self/...; requests are rewritten to /v1/sandboxes/<id>/... so no other sandbox can
// be named. Commit and forced rollbacks stay with the pipeline outside.
func (o *Orchestrator) selfHandler(id string) http.Handler {
	mux := http.NewServeMux()
	o.checkpointRoutes(mux, "/v1/sandboxes/{id}", true)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/v1/self/")
		if !ok || rest == "commit" || strings.Contains(rest, "..") {
			writeError(r.Context(), w, fmt.Errorf("no route %s %s inside a sandbox (routes are /v1/self/checkpoints, rollback, diff, state, state/log, verify): %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
			return
		}
		r.URL.Path = "/v1/sandboxes/" + id + "/" + rest
		r.URL.RawPath = ""
		o.limiter().wrap(mux).ServeHTTP(w, r)
	})
}

// serveSelf listens on the sandbox's api.sock until ctx ends. The run directory is the
// sandbox's: an existing entry (even a symlink) is removed, never followed.
func (o *Orchestrator) serveSelf(ctx context.Context, s *session) (func(), error) {
	path := filepath.Join(s.sb.RunDir, SelfSocket)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on the sandbox socket: %w", err)
	}
	if err := rootfs.ChmodSocket(path, 0o666); err != nil { // never os.Chmod: it follows a swapped-in symlink
		l.Close()
		return nil, fmt.Errorf("sandbox socket: %w", err)
	}
	srv := &http.Server{Handler: o.selfHandler(s.id), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.L(ctx).Warn("sandbox socket stopped", "sandbox", s.id, "error", err)
		}
	}()
	return func() { srv.Close() }, nil
}
