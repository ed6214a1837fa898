package orchestrator

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// EffectStatuses are the states an effect can be in.
var EffectStatuses = []string{"passed", "held", "released", "dropped", "failed", "compensated", "denied"}

// ListEffects returns a sandbox's effects, optionally only those with status.
func (o *Orchestrator) ListEffects(ctx context.Context, id, status string) ([]api.Effect, error) {
	if _, err := o.session(ctx, id); err != nil {
		return nil, err
	}
	if status != "" && !slices.Contains(EffectStatuses, status) {
		return nil, fmt.Errorf("effect status %q: want one of %v: %w", status, EffectStatuses, errdefs.ErrInvalidArgument)
	}
	all, err := o.effects.List(ctx, id, 0, 0)
	if err != nil {
		return nil, err
	}
	out := []api.Effect{}
	for _, e := range all {
		if status == "" || e.Status == status {
			out = append(out, e)
		}
	}
	return out, nil
}

// InspectEffect returns one effect of a sandbox.
func (o *Orchestrator) InspectEffect(ctx context.Context, id, effect string) (api.Effect, error) {
	all, err := o.ListEffects(ctx, id, "")
	if err != nil {
		return api.Effect{}, err
	}
	for _, e := range all {
		if e.ID == effect {
			return e, nil
		}
	}
	return api.Effect{}, fmt.Errorf("effect %q of sandbox %q: %w", effect, id, errdefs.ErrNotFound)
}

func (o *Orchestrator) effectRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/sandboxes/{id}/effects", handle(func(r *http.Request) (any, error) {
		return o.ListEffects(r.Context(), r.PathValue("id"), r.URL.Query().Get("status"))
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/effects/{effect}", handle(func(r *http.Request) (any, error) {
		return o.InspectEffect(r.Context(), r.PathValue("id"), r.PathValue("effect"))
	}))
}
