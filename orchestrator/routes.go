package orchestrator

import (
	"net/http"
	"strconv"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// routes registers the pool and sandbox routes of the /v1 API.
func (o *Orchestrator) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/pools", handle(o.createPool))
	mux.HandleFunc("GET /v1/pools", handle(func(r *http.Request) (any, error) { return o.pools.Pools(), nil }))
	mux.HandleFunc("GET /v1/pools/{name}", handle(func(r *http.Request) (any, error) { return o.pools.Pool(r.PathValue("name")) }))
	mux.HandleFunc("DELETE /v1/pools/{name}", handle(o.removePool))
	mux.HandleFunc("POST /v1/pools/{name}/scale", handle(o.scalePool))
	mux.HandleFunc("POST /v1/pools/{name}/lease", handle(o.lease))
	mux.HandleFunc("GET /v1/sandboxes", handle(func(r *http.Request) (any, error) { return o.pools.List(), nil }))
	mux.HandleFunc("GET /v1/sandboxes/{id}", handle(func(r *http.Request) (any, error) { return o.pools.Get(r.PathValue("id")) }))
	mux.HandleFunc("POST /v1/sandboxes/{id}/release", handle(o.release))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", o.exec)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", handle(o.copyTo))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", o.copyFrom)
}

func (o *Orchestrator) createPool(r *http.Request) (any, error) {
	var t pool.Template
	if err := decode(r, &t); err != nil {
		return nil, err
	}
	return o.pools.CreatePool(r.Context(), t)
}

func (o *Orchestrator) removePool(r *http.Request) (any, error) {
	force, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	if err := o.pools.RemovePool(r.Context(), r.PathValue("name"), force); err != nil {
		return nil, err
	}
	return map[string]string{"removed": r.PathValue("name")}, nil
}

func (o *Orchestrator) scalePool(r *http.Request) (any, error) {
	var req api.ScaleRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	return o.pools.ScalePool(r.Context(), r.PathValue("name"), req.MinReady)
}

func (o *Orchestrator) lease(r *http.Request) (any, error) {
	start := time.Now()
	var req api.LeaseRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	res, err := o.pools.Lease(r.Context(), r.PathValue("name"), pool.LeaseRequest{Env: req.Env, Labels: req.Labels})
	if err != nil {
		return nil, err
	}
	return api.Lease{LeaseResult: res, LeaseMS: float64(time.Since(start).Microseconds()) / 1000}, nil
}

func (o *Orchestrator) release(r *http.Request) (any, error) {
	id := r.PathValue("id")
	if err := o.pools.Release(r.Context(), id); err != nil {
		return nil, err
	}
	return map[string]string{"released": id}, nil
}
