package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// RetryEffects sends a sandbox's failed effects again (the named ones, or every failed one);
// it returns an error naming those that failed again.
func (c *Client) RetryEffects(ctx context.Context, id string, effects ...string) (api.RetryEffectsResult, error) {
	var res api.RetryEffectsResult
	req := api.RetryEffectsRequest{Effects: append([]string{}, effects...)}
	return res, c.do(ctx, http.MethodPost, sandboxPath(id, "/effects/retry"), req, &res)
}

// AbandonEffect gives up a failed effect: it is never sent again.
func (c *Client) AbandonEffect(ctx context.Context, id, effect string) (api.Effect, error) {
	var e api.Effect
	return e, c.do(ctx, http.MethodPost, sandboxPath(id, "/effects/"+url.PathEscape(effect)+"/abandon"), nil, &e)
}
