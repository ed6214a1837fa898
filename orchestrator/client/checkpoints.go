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

// stream posts a JSON body and reads a JSON-lines answer: progress goes to onProgress, the
// final event is returned (an error event as an error).
func (c *Client) stream(ctx context.Context, path string, body any, onProgress func(api.Progress)) (api.StreamEvent, error) {
	resp, err := c.send(ctx, http.MethodPost, path, body)
	if err != nil {
		return api.StreamEvent{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev api.StreamEvent
		if err := dec.Decode(&ev); err != nil {
			return ev, fmt.Errorf("stream ended without a result: %w", ctxErr(ctx, err))
		}
		switch {
		case ev.Error != nil:
			return ev, api.ToError(*ev.Error)
		case ev.Progress != nil:
			if onProgress != nil {
				onProgress(*ev.Progress)
			}
		default:
			return ev, nil
		}
	}
}

// SnapshotPush takes an L3 checkpoint and uploads it as a snapshot.
func (c *Client) SnapshotPush(ctx context.Context, id, to string, onProgress func(api.Progress)) (api.Snapshot, error) {
	ev, err := c.stream(ctx, sandboxPath(id, "/snapshots"), api.SnapshotRequest{To: to}, onProgress)
	if err != nil || ev.Snapshot == nil {
		return api.Snapshot{}, err
	}
	return *ev.Snapshot, nil
}

// Fork snapshots a sandbox once and restores it count times.
func (c *Client) Fork(ctx context.Context, id, to string, count int, onProgress func(api.Progress)) ([]api.Lease, error) {
	return c.ForkWith(ctx, id, api.SnapshotRequest{To: to, Count: count}, onProgress)
}

// ForkWith is Fork with every option of the request (KeepSnapshot).
func (c *Client) ForkWith(ctx context.Context, id string, req api.SnapshotRequest, onProgress func(api.Progress)) ([]api.Lease, error) {
	ev, err := c.stream(ctx, sandboxPath(id, "/fork"), req, onProgress)
	return ev.Leases, err
}

// Restore creates a sandbox from a snapshot.
func (c *Client) Restore(ctx context.Context, uri, pool string, onProgress func(api.Progress)) (api.Lease, error) {
	return c.RestoreWith(ctx, api.RestoreRequest{URI: uri, Pool: pool}, onProgress)
}

// RestoreWith is Restore with every option of the request (AdoptHeldEffects).
func (c *Client) RestoreWith(ctx context.Context, req api.RestoreRequest, onProgress func(api.Progress)) (api.Lease, error) {
	ev, err := c.stream(ctx, "/restore", req, onProgress)
	if err != nil || len(ev.Leases) == 0 {
		return api.Lease{}, err
	}
	return ev.Leases[0], nil
}

// Snapshots lists the snapshots of a store ("" = the daemon's).
func (c *Client) Snapshots(ctx context.Context, store string) ([]api.Snapshot, error) {
	var out []api.Snapshot
	return out, c.do(ctx, http.MethodGet, "/snapshots?store="+url.QueryEscape(store), nil, &out)
}

// SnapshotRemove deletes a snapshot (and blobs only it used).
func (c *Client) SnapshotRemove(ctx context.Context, uri string) error {
	return c.do(ctx, http.MethodDelete, "/snapshots?uri="+url.QueryEscape(uri), nil, nil)
}
