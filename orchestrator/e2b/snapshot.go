package e2b

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// snapshot is an E2B snapshot: a DeltaBox L3 snapshot in the daemon's object store, restored
// into the pool of the sandbox it was taken from by Sandbox.create(snapshotID or name). The
// gateway's list of them lives in memory (the blobs persist in the store; after a restart
// they are reachable with `deltabox restore`).
type snapshot struct {
	id      string // the DeltaBox snapshot name
	uri     string
	pool    string
	tenant  string
	source  string // sandbox
	names   []string
	created time.Time
	meta    map[string]string
}

func (g *Gateway) createSnapshot(r *http.Request, sb *sandbox) (int, any, error) {
	var req snapshotRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := sb.running(); err != nil {
		return 0, nil, err
	}
	if req.Name != "" && g.snapshotFor(sb.tenant, req.Name) != nil {
		return 0, nil, fmt.Errorf("snapshot name %q is taken: %w", req.Name, errdefs.ErrConflict)
	}
	s, err := g.b.PushSnapshot(r.Context(), sb.id)
	if err != nil {
		return 0, nil, err
	}
	snap := &snapshot{id: s.Name, uri: s.URI, pool: sb.template, tenant: sb.tenant, source: sb.id,
		names: []string{}, created: time.Now(), meta: map[string]string{}}
	if req.Name != "" {
		snap.names = append(snap.names, req.Name)
	}
	for k, v := range sb.metadata {
		snap.meta[k] = v
	}
	g.mu.Lock()
	g.snapshots[snap.id] = snap
	g.mu.Unlock()
	log.L(r.Context()).Info("e2b snapshot created", "sandbox", sb.id, "snapshot", snap.uri)
	return http.StatusCreated, snapshotInfo{SnapshotID: snap.id, Names: snap.names}, nil
}

// snapshotFor finds the tenant's snapshot by ID or name.
func (g *Gateway) snapshotFor(tenant, ref string) *snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.snapshots[ref]; s != nil && s.tenant == tenant {
		return s
	}
	for _, s := range g.snapshots {
		for _, n := range s.names {
			if n == ref && s.tenant == tenant {
				return s
			}
		}
	}
	return nil
}

func (g *Gateway) listSnapshots(r *http.Request, tenant string) (int, any, error) {
	q := r.URL.Query()
	g.mu.Lock()
	var snaps []*snapshot
	for _, s := range g.snapshots {
		if s.tenant != tenant || (q.Get("sandboxID") != "" && s.source != q.Get("sandboxID")) {
			continue
		}
		if n := q.Get("name"); n != "" && !containsName(s.names, n) {
			continue
		}
		snaps = append(snaps, s)
	}
	g.mu.Unlock()
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].created.Before(snaps[j].created) })
	out := []snapshotInfo{}
	for _, s := range snaps {
		out = append(out, snapshotInfo{SnapshotID: s.id, Names: s.names})
	}
	return http.StatusOK, out, nil
}

func containsName(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

// deleteSnapshot answers DELETE /templates/{id} for a snapshot: its blobs are removed.
func (g *Gateway) deleteSnapshot(r *http.Request, tenant string) (int, any, error) {
	s := g.snapshotFor(tenant, r.PathValue("id"))
	if s == nil {
		return 0, nil, fmt.Errorf("snapshot %q not found (templates are DeltaBox pools and are not deleted here): %w", r.PathValue("id"), errdefs.ErrNotFound)
	}
	if err := g.b.SnapshotRemove(r.Context(), s.uri); err != nil {
		return 0, nil, err
	}
	g.mu.Lock()
	delete(g.snapshots, s.id)
	g.mu.Unlock()
	return http.StatusNoContent, nil, nil
}

// createFromSnapshot restores a snapshot into a new sandbox of the tenant.
func (g *Gateway) createFromSnapshot(ctx context.Context, tenant string, snap *snapshot, req newSandboxRequest, timeout time.Duration) (*sandbox, error) {
	l, err := g.b.RestoreSnapshot(ctx, snap.uri, snap.pool)
	if err != nil {
		return nil, fmt.Errorf("restore snapshot %q: %w", snap.id, err)
	}
	sb := g.newSandbox(l.ID, snap.pool, tenant, l.Workdir)
	sb.token = randomToken()
	sb.tokenHash = []string{tokenHash(sb.token)}
	for k, v := range snap.meta {
		sb.metadata[k] = v
	}
	for k, v := range req.Metadata {
		sb.metadata[k] = v
	}
	sb.autoPause = req.AutoPause != nil && *req.AutoPause
	sb.perCommand = sb.metadata[MetaCheckpoint] == "per_command"
	g.mu.Lock()
	g.sandboxes[sb.id] = sb
	g.mu.Unlock()
	sb.setTimeout(timeout)
	log.L(ctx).Info("e2b sandbox created from a snapshot", "sandbox", sb.id, "snapshot", snap.uri, "tenant", tenant)
	return sb, nil
}
