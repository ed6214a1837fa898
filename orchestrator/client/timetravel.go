package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Storyboard returns a sandbox's history along its current branch (all: the whole tree).
func (c *Client) Storyboard(ctx context.Context, id string, all bool) (api.Storyboard, error) {
	var sb api.Storyboard
	return sb, c.do(ctx, http.MethodGet, sandboxPath(id, fmt.Sprintf("/log?all=%t", all)), nil, &sb)
}

// ShowFile writes the content of path as of checkpoint ckpt (a reference) to w.
func (c *Client) ShowFile(ctx context.Context, id, ckpt, path string, w io.Writer) (api.FileInfo, error) {
	var info api.FileInfo
	resp, err := c.sendRaw(ctx, http.MethodGet, sandboxPath(id, "/checkpoints/"+url.PathEscape(ckpt)+"/file?path="+url.QueryEscape(path)), nil, "")
	if err != nil {
		return info, err
	}
	defer resp.Body.Close()
	if err := json.Unmarshal([]byte(resp.Header.Get("X-Deltabox-File")), &info); err != nil {
		return info, fmt.Errorf("decode file description: %w", err)
	}
	_, err = io.Copy(w, resp.Body)
	return info, err
}

// StateAt returns the state document (or the value at pointer) as of checkpoint ckpt.
func (c *Client) StateAt(ctx context.Context, id, ckpt, pointer string) (json.RawMessage, error) {
	var v json.RawMessage
	return v, c.do(ctx, http.MethodGet, sandboxPath(id, "/state?pointer="+url.QueryEscape(pointer)+"&at="+url.QueryEscape(ckpt)), nil, &v)
}

// Forward sends one request to the daemon's API as it is (path and query under /v1, body,
// content type) and returns the daemon's response, errors included; for local proxies such
// as `deltabox ui`. The caller closes the body.
func (c *Client) Forward(ctx context.Context, method, pathAndQuery string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := c.newRequest(ctx, method, pathAndQuery, body, contentType)
	if err != nil {
		return nil, err
	}
	return c.http.Do(req)
}

// Pin pins (or unpins) a checkpoint: retention never drops a pinned one.
func (c *Client) Pin(ctx context.Context, id, ckpt string, on bool) (api.Checkpoint, error) {
	var ck api.Checkpoint
	return ck, c.do(ctx, http.MethodPost, sandboxPath(id, "/checkpoints/"+url.PathEscape(ckpt)+"/pin"), api.PinRequest{Pinned: on}, &ck)
}
