package orchestrator

import (
	"encoding/json"
	"net/http"
	"sync"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func (o *Orchestrator) snapshotRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", o.stream(func(r *http.Request, emit Emit) (api.StreamEvent, error) {
		var req api.SnapshotRequest
		if err := decode(r, &req); err != nil {
			return api.StreamEvent{}, err
		}
		snap, err := o.SnapshotPush(r.Context(), r.PathValue("id"), req.To, emit)
		return api.StreamEvent{Snapshot: &snap}, err
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", o.stream(func(r *http.Request, emit Emit) (api.StreamEvent, error) {
		var req api.SnapshotRequest
		if err := decode(r, &req); err != nil {
			return api.StreamEvent{}, err
		}
		fork := o.Fork
		if req.From != "" {
			fork = o.ForkFrom
		}
		leases, err := fork(r.Context(), r.PathValue("id"), req, emit)
		return api.StreamEvent{Leases: leases}, err
	}))
	mux.HandleFunc("POST /v1/restore", o.stream(func(r *http.Request, emit Emit) (api.StreamEvent, error) {
		var req api.RestoreRequest
		if err := decode(r, &req); err != nil {
			return api.StreamEvent{}, err
		}
		l, err := o.RestoreWith(r.Context(), req, emit)
		return api.StreamEvent{Leases: []api.Lease{l}}, err
	}))
	mux.HandleFunc("GET /v1/snapshots", handle(func(r *http.Request) (any, error) {
		return o.Snapshots(r.Context(), r.URL.Query().Get("store"))
	}))
	mux.HandleFunc("DELETE /v1/snapshots", handle(func(r *http.Request) (any, error) {
		uri := r.URL.Query().Get("uri")
		return map[string]string{"removed": uri}, o.SnapshotRemove(r.Context(), uri)
	}))
}

// stream answers with JSON lines: progress events as fn emits them, then one final event with
// its result or error. Every line is flushed at once.
func (o *Orchestrator) stream(fn func(*http.Request, Emit) (api.StreamEvent, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		var mu sync.Mutex
		send := func(ev api.StreamEvent) {
			mu.Lock()
			defer mu.Unlock()
			_ = json.NewEncoder(w).Encode(ev)
			_ = rc.Flush()
		}
		final, err := fn(r, func(p api.Progress) { send(api.StreamEvent{Progress: &p}) })
		if err != nil {
			code, _ := api.FromError(err)
			final = api.StreamEvent{Error: &api.Error{Code: code, Message: err.Error()}}
		}
		send(final)
	}
}
