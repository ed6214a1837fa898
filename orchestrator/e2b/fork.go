package e2b

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// maxForks bounds one fork request.
const maxForks = 16

// fork answers POST /sandboxes/{id}/fork with DeltaBox's fork: one L3 snapshot of the
// sandbox (processes, memory, files) restored count times into its pool. Each copy is a new
// sandbox of the same tenant with its own access token and timeout.
func (g *Gateway) fork(r *http.Request, sb *sandbox) (int, any, error) {
	var req forkRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > maxForks {
		return 0, nil, fmt.Errorf("fork count %d: want 1 to %d: %w", count, maxForks, errdefs.ErrInvalidArgument)
	}
	timeout, err := g.timeout(req.Timeout)
	if err != nil {
		return 0, nil, err
	}
	if err := sb.running(); err != nil {
		return 0, nil, err
	}
	leases, ferr := g.b.ForkSandbox(r.Context(), sb.id, count)
	out := make([]forkResult, 0, count)
	for _, l := range leases {
		c := g.adoptFork(r.Context(), sb, l.ID, l.Workdir, timeout)
		out = append(out, forkResult{Sandbox: &c})
	}
	if ferr != nil {
		if len(leases) == 0 {
			return 0, nil, ferr
		}
		_, status := connectCode(ferr)
		for len(out) < count {
			out = append(out, forkResult{Error: &apiError{Code: status, Message: ferr.Error()}})
		}
	}
	return http.StatusOK, out, nil
}

// adoptFork registers a fork of src as the tenant's sandbox.
func (g *Gateway) adoptFork(ctx context.Context, src *sandbox, id, workdir string, timeout time.Duration) sandboxCreated {
	sb := g.newSandbox(id, src.template, src.tenant, workdir)
	sb.token = randomToken()
	sb.tokenHash = []string{tokenHash(sb.token)}
	sb.autoPause, sb.perCommand = src.autoPause, src.perCommand
	for k, v := range src.metadata {
		sb.metadata[k] = v
	}
	g.mu.Lock()
	g.sandboxes[id] = sb
	g.mu.Unlock()
	sb.setTimeout(timeout)
	log.L(ctx).Info("e2b sandbox forked", "sandbox", id, "from", src.id, "tenant", src.tenant)
	return sb.created()
}
