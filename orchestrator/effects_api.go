package orchestrator

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/proxy"
)

// EffectStatuses are the states an effect can be in.
var EffectStatuses = []string{"passed", "held", "sending", "released", "dropped", "failed", "compensated", "abandoned", "denied"}

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
			if rd, ok := o.effects.(requestDetailer); ok {
				req, err := rd.Request(id, effect)
				if err != nil {
					return e, err
				}
				e.Request = &req
			}
			return e, nil
		}
	}
	return api.Effect{}, fmt.Errorf("effect %q of sandbox %q: %w", effect, id, errdefs.ErrNotFound)
}

// RetryEffects sends failed effects of a sandbox again (the named ones, or every failed one),
// each with the Idempotency-Key it always had. It fails (failed_precondition, naming them)
// if any failed again. No session lock is held: only effects a commit already took are sent.
func (o *Orchestrator) RetryEffects(ctx context.Context, id string, req api.RetryEffectsRequest) (api.RetryEffectsResult, error) {
	p, err := o.egressOf(ctx, id)
	if err != nil {
		return api.RetryEffectsResult{}, err
	}
	res, err := p.Retry(ctx, id, req.Effects...)
	out := api.RetryEffectsResult{ID: id, EffectsReleased: res.Released, EffectsFailed: res.Failed, Effects: []api.Effect{}}
	for _, e := range res.Effects {
		out.Effects = append(out.Effects, apiEffect(e))
	}
	if err == nil {
		err = res.FailedError()
	}
	if err != nil {
		return out, fmt.Errorf("retry effects of sandbox %q: %w", id, err)
	}
	log.L(ctx).Info("effects retried", "sandbox", id, "released", res.Released)
	return out, nil
}

// AbandonEffect gives up a failed effect: it is never sent again.
func (o *Orchestrator) AbandonEffect(ctx context.Context, id, effect string) (api.Effect, error) {
	p, err := o.egressOf(ctx, id)
	if err != nil {
		return api.Effect{}, err
	}
	e, err := p.Abandon(ctx, id, effect)
	if err != nil {
		return api.Effect{}, fmt.Errorf("sandbox %q: %w", id, err)
	}
	return apiEffect(e), nil
}

// egressOf returns the proxy after checking that the sandbox exists.
func (o *Orchestrator) egressOf(ctx context.Context, id string) (*proxy.Proxy, error) {
	if _, err := o.session(ctx, id); err != nil {
		return nil, err
	}
	if o.proxy == nil {
		return nil, fmt.Errorf("sandbox %q has no effects: the node runs without an egress proxy: %w", id, errdefs.ErrFailedPrecondition)
	}
	return o.proxy, nil
}

// failedEffectsError names the sandbox's failed effects a commit up to upto sent, for a
// commit that must not report success.
func (o *Orchestrator) failedEffectsError(ctx context.Context, id string, upto uint64) error {
	all, err := o.effects.List(ctx, id, 0, upto)
	if err != nil {
		return err
	}
	var parts []string
	for _, e := range all {
		if e.Status == string(proxy.StatusFailed) {
			parts = append(parts, fmt.Sprintf("%s (%s %s, %d attempts: %s)", e.ID, e.Method, e.URL, e.Attempts, e.Error))
		}
	}
	return fmt.Errorf("%d effects failed: %s; retry or abandon them (deltabox effects retry|abandon): %w",
		len(parts), strings.Join(parts, "; "), errdefs.ErrFailedPrecondition)
}

// apiEffect is the API's view of an effect.
func apiEffect(x proxy.Effect) api.Effect {
	e := api.Effect{ID: x.ID, Seq: x.Seq, Checkpoint: x.Checkpoint, Method: x.Method, URL: x.URL,
		Status: string(x.Status), ResponseStatus: x.ResponseStatus, Attempts: x.Attempts, Created: x.Created,
		Error: x.Error, History: []api.EffectAttempt{}, NextAttempt: x.NextAttempt, Suspect: x.Suspect}
	for _, a := range x.History {
		e.History = append(e.History, api.EffectAttempt{Time: a.Time, Status: a.Status, Error: a.Error})
	}
	return e
}

func (o *Orchestrator) effectRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/sandboxes/{id}/effects", handle(func(r *http.Request) (any, error) {
		return o.ListEffects(r.Context(), r.PathValue("id"), r.URL.Query().Get("status"))
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/effects/{effect}", handle(func(r *http.Request) (any, error) {
		return o.InspectEffect(r.Context(), r.PathValue("id"), r.PathValue("effect"))
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/effects/retry", handle(func(r *http.Request) (any, error) {
		var req api.RetryEffectsRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return o.RetryEffects(r.Context(), r.PathValue("id"), req)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/effects/{effect}/abandon", handle(func(r *http.Request) (any, error) {
		return o.AbandonEffect(r.Context(), r.PathValue("id"), r.PathValue("effect"))
	}))
}
