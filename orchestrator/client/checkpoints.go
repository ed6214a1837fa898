package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func sandboxPath(id, rest string) string { return "/sandboxes/" + url.PathEscape(id) + rest }

// Checkpoint takes a checkpoint of a sandbox.
func (c *Client) Checkpoint(ctx context.Context, id string, req api.CheckpointRequest) (api.Checkpoint, error) {
	var ck api.Checkpoint
	return ck, c.do(ctx, http.MethodPost, sandboxPath(id, "/checkpoints"), req, &ck)
}

// Checkpoints lists a sandbox's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]api.Checkpoint, error) {
	var cks []api.Checkpoint
	return cks, c.do(ctx, http.MethodGet, sandboxPath(id, "/checkpoints"), nil, &cks)
}

// InspectCheckpoint returns one checkpoint.
func (c *Client) InspectCheckpoint(ctx context.Context, id, ckpt string) (api.Checkpoint, error) {
	var ck api.Checkpoint
	return ck, c.do(ctx, http.MethodGet, sandboxPath(id, "/checkpoints/"+url.PathEscape(ckpt)), nil, &ck)
}

// Rollback returns a sandbox to a checkpoint.
func (c *Client) Rollback(ctx context.Context, id string, req api.RollbackRequest) (api.RollbackResult, error) {
	var res api.RollbackResult
	return res, c.do(ctx, http.MethodPost, sandboxPath(id, "/rollback"), req, &res)
}

// Commit releases a sandbox's held effects and sets its commit point.
func (c *Client) Commit(ctx context.Context, id string) (api.CommitResult, error) {
	var res api.CommitResult
	return res, c.do(ctx, http.MethodPost, sandboxPath(id, "/commit"), nil, &res)
}

// Diff reports what changed between two checkpoints (to "" = now).
func (c *Client) Diff(ctx context.Context, id, from, to string) (api.Diff, error) {
	var d api.Diff
	q := url.Values{"from": {from}, "to": {to}}
	return d, c.do(ctx, http.MethodGet, sandboxPath(id, "/diff?"+q.Encode()), nil, &d)
}

// StateGet returns the state document or the value at pointer.
func (c *Client) StateGet(ctx context.Context, id, pointer string) (json.RawMessage, error) {
	var v json.RawMessage
	return v, c.do(ctx, http.MethodGet, sandboxPath(id, "/state?pointer="+url.QueryEscape(pointer)), nil, &v)
}

// StatePatch applies a JSON patch (an array of ops); ifSeq < 0 means unconditional.
func (c *Client) StatePatch(ctx context.Context, id string, ops []byte, ifSeq int64) (api.StatePatchResult, error) {
	var res api.StatePatchResult
	p := sandboxPath(id, "/state")
	if ifSeq >= 0 {
		p += fmt.Sprintf("?if_seq=%d", ifSeq)
	}
	resp, err := c.sendRaw(ctx, http.MethodPost, p, bytes.NewReader(ops), "application/json-patch+json")
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	return res, json.NewDecoder(resp.Body).Decode(&res)
}

// StateLog returns logged state ops with from < seq <= to (to 0: up to now).
func (c *Client) StateLog(ctx context.Context, id string, from, to uint64) ([]api.StateEntry, error) {
	var out []api.StateEntry
	return out, c.do(ctx, http.MethodGet, sandboxPath(id, fmt.Sprintf("/state/log?from=%d&to=%d", from, to)), nil, &out)
}

// Verify checks a sandbox's state log and files against a checkpoint ("" = the latest).
func (c *Client) Verify(ctx context.Context, id, ckpt string) (api.VerifyResult, error) {
	var res api.VerifyResult
	return res, c.do(ctx, http.MethodGet, sandboxPath(id, "/verify?checkpoint="+url.QueryEscape(ckpt)), nil, &res)
}

// Effects lists a sandbox's effects, optionally only those with status.
func (c *Client) Effects(ctx context.Context, id, status string) ([]api.Effect, error) {
	var out []api.Effect
	return out, c.do(ctx, http.MethodGet, sandboxPath(id, "/effects?status="+url.QueryEscape(status)), nil, &out)
}

// Effect returns one effect.
func (c *Client) Effect(ctx context.Context, id, effect string) (api.Effect, error) {
	var e api.Effect
	return e, c.do(ctx, http.MethodGet, sandboxPath(id, "/effects/"+url.PathEscape(effect)), nil, &e)
}
