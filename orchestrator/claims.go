package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// A lease's session directory names the container it runs in (sandbox.json), so that the
// pool database is not the only witness of a lease: a start that finds a container without a
// trusted record, but claimed by a session directory, quarantines it instead of destroying
// it with its checkpoints and state (pool.Options.Claims). The operator then adopts it (the
// session, checkpoints included, is reopened) or destroys it.

const claimFile = "sandbox.json"

// sandboxClaim is the content of a session's sandbox.json.
type sandboxClaim struct {
	Container string     `json:"container"`
	Pool      string     `json:"pool"`
	Lease     pool.Lease `json:"lease"`
}

// writeClaim records, in the session directory, which container the lease runs in (unless it
// says so already).
func (s *session) writeClaim() error {
	c := sandboxClaim{Container: s.sb.Container, Pool: s.sb.Pool, Lease: pool.Lease{ID: s.sb.ID, Env: s.sb.Env,
		Labels: s.sb.Labels, LeasedAt: s.sb.LeasedAt, EgressPolicy: s.sb.EgressPolicy}}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	path := filepath.Join(s.dir, claimFile)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil // a restart on a full state root must not make the lease unusable
	}
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("record the sandbox's container: %w", err)
	}
	return nil
}

// readClaims returns the containers claimed by session directories, by container ID. A claim
// counts only when its lease ID is the directory's name.
func (o *Orchestrator) readClaims(ctx context.Context) map[string]pool.Claim {
	root := filepath.Join(o.opts.Root, "sandboxes")
	dirs, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.L(ctx).Warn("read session directories for claims", "error", err)
		}
		return nil
	}
	out := map[string]pool.Claim{}
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(root, d.Name(), claimFile))
		if err != nil {
			continue
		}
		var c sandboxClaim
		if err := json.Unmarshal(data, &c); err != nil || c.Lease.ID != d.Name() || c.Container == "" {
			log.L(ctx).Warn("ignoring unreadable sandbox claim", "sandbox", d.Name(), "error", err)
			continue
		}
		out[c.Container] = pool.Claim{Lease: c.Lease, Pool: c.Pool}
	}
	return out
}

// Adopt makes quarantined sandbox id leased again (in poolName, or the pool it was known by)
// and reopens its session: its checkpoints and state are those it had.
func (o *Orchestrator) Adopt(ctx context.Context, id, poolName string) (api.Sandbox, error) {
	sb, err := o.pools.Adopt(ctx, id, poolName)
	if err != nil {
		return api.Sandbox{}, err
	}
	s := o.startSession(ctx, sb)
	select {
	case <-s.ready:
	case <-ctx.Done():
		return api.Sandbox{}, ctx.Err()
	}
	if s.openErr != nil {
		return apiSandbox(sb), fmt.Errorf("sandbox %s adopted, but its session did not open: %w", sb.ID, s.openErr)
	}
	return apiSandbox(sb), nil
}

// DestroyQuarantined destroys quarantined sandbox id with its session directory
// (checkpoints and state).
func (o *Orchestrator) DestroyQuarantined(ctx context.Context, id string) error {
	lease, err := o.pools.DestroyQuarantined(ctx, id)
	if err != nil {
		return err
	}
	if validSessionName(lease) {
		if err := os.RemoveAll(o.sessionDir(lease)); err != nil {
			return fmt.Errorf("remove the session of %s: %w", lease, err)
		}
	}
	return nil
}

// validSessionName reports whether id can name a session directory.
func validSessionName(id string) bool {
	return id != "" && id != "." && id != ".." && filepath.Base(id) == id
}

// apiQuarantined lists the quarantined sandboxes as the API shows them.
func apiQuarantined(qs []pool.Quarantined) []api.Sandbox {
	out := make([]api.Sandbox, 0, len(qs))
	for _, q := range qs {
		out = append(out, api.Sandbox{ID: q.ID, Pool: q.Pool, Container: q.Container, Created: q.Created,
			LeasedAt: q.LeasedAt, State: api.StateQuarantined, Reason: q.Reason})
	}
	return out
}

// listSandboxes is the leased sandboxes, then the quarantined ones.
func (o *Orchestrator) listSandboxes() []api.Sandbox {
	out := apiSandboxes(o.pools.List())
	if out == nil {
		out = []api.Sandbox{}
	}
	return append(out, apiQuarantined(o.pools.Quarantined())...)
}

// quarantinedError explains why a quarantined sandbox cannot be used.
func (o *Orchestrator) quarantinedError(id string) error {
	for _, q := range o.pools.Quarantined() {
		if q.ID == id || q.Container == id {
			return fmt.Errorf("sandbox %q is quarantined (%s): adopt it with `deltabox sandbox adopt %s [--pool P]` or destroy it with `deltabox sandbox destroy %s`: %w",
				id, q.Reason, id, id, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

func (o *Orchestrator) adopt(r *http.Request) (any, error) {
	var req api.AdoptRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	return o.Adopt(r.Context(), r.PathValue("id"), req.Pool)
}
