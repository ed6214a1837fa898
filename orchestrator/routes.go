package orchestrator

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// routes registers the pool and sandbox routes of the /v1 API.
func (o *Orchestrator) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/pools", handle(o.createPool))
	mux.HandleFunc("GET /v1/pools", handle(func(r *http.Request) (any, error) { return apiPoolInfos(o.pools.Pools()), nil }))
	mux.HandleFunc("GET /v1/pools/{name}", handle(func(r *http.Request) (any, error) {
		p, err := o.pools.Pool(r.PathValue("name"))
		return apiPoolInfo(p), err
	}))
	mux.HandleFunc("DELETE /v1/pools/{name}", handle(o.removePool))
	mux.HandleFunc("POST /v1/pools/{name}/scale", handle(o.scalePool))
	mux.HandleFunc("POST /v1/pools/{name}/lease", handle(o.lease))
	mux.HandleFunc("GET /v1/sandboxes", handle(func(r *http.Request) (any, error) { return o.listSandboxes(), nil }))
	mux.HandleFunc("POST /v1/sandboxes/{id}/adopt", handle(o.adopt))
	mux.HandleFunc("POST /v1/sandboxes/{id}/destroy", handle(func(r *http.Request) (any, error) {
		return map[string]string{"destroyed": r.PathValue("id")}, o.DestroyQuarantined(r.Context(), r.PathValue("id"))
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}", handle(func(r *http.Request) (any, error) {
		sb, err := o.pools.Get(r.PathValue("id"))
		return apiSandbox(sb), err
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/release", handle(o.release))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", o.exec)
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec/tty", o.execTTY)
	mux.HandleFunc("GET /v1/sandboxes/{id}/procs", handle(func(r *http.Request) (any, error) {
		if _, err := o.session(r.Context(), r.PathValue("id")); err != nil {
			return nil, err
		}
		return o.procs.list(r.PathValue("id")), nil
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/procs/{proc}/logs", o.procLogs)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", handle(o.copyTo))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", o.copyFrom)
	o.checkpointRoutes(mux, "/v1/sandboxes/{id}", false)
	o.timeTravelRoutes(mux)
	o.effectRoutes(mux)
	o.snapshotRoutes(mux)
}

// checkpointRoutes registers the checkpoint and state routes under prefix; the per-sandbox
// socket inside each sandbox serves the same handlers (inSandbox), less what the host reserves.
func (o *Orchestrator) checkpointRoutes(mux *http.ServeMux, prefix string, inSandbox bool) {
	mux.HandleFunc("POST "+prefix+"/checkpoints", handle(o.createCheckpoint))
	mux.HandleFunc("GET "+prefix+"/checkpoints", handle(func(r *http.Request) (any, error) { return o.Checkpoints(r.Context(), r.PathValue("id")) }))
	mux.HandleFunc("GET "+prefix+"/checkpoints/{ckpt}", handle(func(r *http.Request) (any, error) {
		return o.InspectCheckpoint(r.Context(), r.PathValue("id"), r.PathValue("ckpt"))
	}))
	mux.HandleFunc("POST "+prefix+"/rollback", handle(o.rollback(inSandbox)))
	mux.HandleFunc("POST "+prefix+"/commit", handle(func(r *http.Request) (any, error) { return o.Commit(r.Context(), r.PathValue("id")) }))
	mux.HandleFunc("GET "+prefix+"/diff", handle(func(r *http.Request) (any, error) {
		q := r.URL.Query()
		return o.Diff(r.Context(), r.PathValue("id"), q.Get("from"), q.Get("to"))
	}))
	mux.HandleFunc("GET "+prefix+"/state", handle(func(r *http.Request) (any, error) {
		if at := r.URL.Query().Get("at"); at != "" { // as of a checkpoint (docs/time-travel.md)
			return o.StateAt(r.Context(), r.PathValue("id"), at, r.URL.Query().Get("pointer"))
		}
		return o.StateGet(r.Context(), r.PathValue("id"), r.URL.Query().Get("pointer"))
	}))
	mux.HandleFunc("POST "+prefix+"/state", handle(o.statePatch))
	mux.HandleFunc("GET "+prefix+"/state/log", handle(o.stateLog))
	mux.HandleFunc("GET "+prefix+"/verify", handle(func(r *http.Request) (any, error) {
		return o.Verify(r.Context(), r.PathValue("id"), r.URL.Query().Get("checkpoint"))
	}))
}

func (o *Orchestrator) createCheckpoint(r *http.Request) (any, error) {
	var req api.CheckpointRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	return o.Checkpoint(r.Context(), r.PathValue("id"), req)
}

// rollback serves POST .../rollback. The body is decoded once and the decoded request is what
// is checked and acted on: from inside a sandbox (inSandbox) a forced rollback is refused.
func (o *Orchestrator) rollback(inSandbox bool) func(r *http.Request) (any, error) {
	return func(r *http.Request) (any, error) {
		var req api.RollbackRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		if inSandbox && req.Force {
			return nil, fmt.Errorf("forced rollback (past a commit) is not available inside a sandbox: %w", errdefs.ErrFailedPrecondition)
		}
		return o.Rollback(r.Context(), r.PathValue("id"), req)
	}
}

func (o *Orchestrator) createPool(r *http.Request) (any, error) {
	var t api.Template
	if err := decode(r, &t); err != nil {
		return nil, err
	}
	if err := ValidatePolicy(t.EgressPolicy); err != nil {
		return nil, fmt.Errorf("pool %q: egress policy: %w", t.Name, err)
	}
	p, err := o.pools.CreatePool(r.Context(), poolTemplate(t))
	return apiPoolInfo(p), err
}

func (o *Orchestrator) removePool(r *http.Request) (any, error) {
	name := r.PathValue("name")
	force, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	var leased []pool.Sandbox
	for _, sb := range o.pools.List() {
		if sb.Pool == name {
			leased = append(leased, sb)
		}
	}
	if err := o.pools.RemovePool(r.Context(), name, force); err != nil {
		return nil, err
	}
	for _, sb := range leased { // destroyed with the pool (force)
		o.unregisterEgress(sb)
		o.endSession(r.Context(), sb.ID)
	}
	return map[string]string{"removed": name}, nil
}

func (o *Orchestrator) scalePool(r *http.Request) (any, error) {
	var req api.ScaleRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	p, err := o.pools.ScalePool(r.Context(), r.PathValue("name"), req.MinReady)
	return apiPoolInfo(p), err
}

func (o *Orchestrator) lease(r *http.Request) (any, error) {
	var req api.LeaseRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	return o.Lease(r.Context(), r.PathValue("name"), req)
}

// Lease takes a sandbox from the pool name with the late-bound settings of req and starts
// its session (first checkpoint), as POST /v1/pools/{name}/lease does.
func (o *Orchestrator) Lease(ctx context.Context, name string, req api.LeaseRequest) (api.Lease, error) {
	start := time.Now()
	if err := ValidatePolicy(req.EgressPolicy); err != nil {
		return api.Lease{}, fmt.Errorf("egress policy: %w", err)
	}
	res, err := o.pools.Lease(ctx, name, pool.LeaseRequest{Env: req.Env, Labels: req.Labels, EgressPolicy: req.EgressPolicy})
	if err != nil {
		return api.Lease{}, err
	}
	o.startSession(ctx, res.Sandbox)
	return api.Lease{LeaseResult: apiLeaseResult(res), LeaseMS: float64(time.Since(start).Microseconds()) / 1000}, nil
}

func (o *Orchestrator) release(r *http.Request) (any, error) {
	id := r.PathValue("id")
	if err := o.Release(r.Context(), id); err != nil {
		return nil, err
	}
	return map[string]string{"released": id}, nil
}

// Release gives a leased sandbox back to its pool and ends its session, as
// POST /v1/sandboxes/{id}/release does.
func (o *Orchestrator) Release(ctx context.Context, id string) error {
	// The proxy forgets the sandbox's address before the pool can hand the sandbox (and so
	// the address) to the next lease.
	if sb, err := o.pools.Get(id); err == nil {
		o.unregisterEgress(sb)
	}
	o.releaseAllTemplates(id) // before the pool kills the sandbox's processes: it waits for them
	if err := o.pools.Release(ctx, id); err != nil {
		return err
	}
	if err := failpoint.Inject("release/before-forget"); err != nil {
		return err
	}
	o.endSession(ctx, id)
	return nil
}
