package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// CreatePool creates a pool from a template.
func (c *Client) CreatePool(ctx context.Context, t api.Template) (api.PoolInfo, error) {
	var p api.PoolInfo
	return p, c.do(ctx, http.MethodPost, "/pools", t, &p)
}

// Pools lists the pools.
func (c *Client) Pools(ctx context.Context) ([]api.PoolInfo, error) {
	var ps []api.PoolInfo
	return ps, c.do(ctx, http.MethodGet, "/pools", nil, &ps)
}

// Pool returns one pool.
func (c *Client) Pool(ctx context.Context, name string) (api.PoolInfo, error) {
	var p api.PoolInfo
	return p, c.do(ctx, http.MethodGet, "/pools/"+url.PathEscape(name), nil, &p)
}

// RemovePool removes a pool; force also destroys its leased sandboxes.
func (c *Client) RemovePool(ctx context.Context, name string, force bool) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/pools/%s?force=%t", url.PathEscape(name), force), nil, nil)
}

// ScalePool sets a pool's min_ready.
func (c *Client) ScalePool(ctx context.Context, name string, minReady int) (api.PoolInfo, error) {
	var p api.PoolInfo
	return p, c.do(ctx, http.MethodPost, "/pools/"+url.PathEscape(name)+"/scale", api.ScaleRequest{MinReady: minReady}, &p)
}

// Lease takes a sandbox from a pool.
func (c *Client) Lease(ctx context.Context, pool string, req api.LeaseRequest) (api.Lease, error) {
	var l api.Lease
	return l, c.do(ctx, http.MethodPost, "/pools/"+url.PathEscape(pool)+"/lease", req, &l)
}

// Release gives a sandbox back to its pool.
func (c *Client) Release(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/release", nil, nil)
}

// Sandboxes lists the leased sandboxes.
func (c *Client) Sandboxes(ctx context.Context) ([]api.Sandbox, error) {
	var s []api.Sandbox
	return s, c.do(ctx, http.MethodGet, "/sandboxes", nil, &s)
}

// Sandbox returns one leased sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var s api.Sandbox
	return s, c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &s)
}

// Exec runs a command in a sandbox, streaming stdin (if not nil) and its output, and returns
// its exit status.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error) {
	req.Stdin = stdin != nil
	line, err := json.Marshal(req)
	if err != nil {
		return api.ExitStatus{}, err
	}
	body := io.Reader(bytes.NewReader(append(line, '\n')))
	if stdin != nil {
		body = io.MultiReader(body, stdin)
	}
	resp, err := c.sendRaw(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/exec", body, "application/x-ndjson")
	if err != nil {
		return api.ExitStatus{}, err
	}
	defer resp.Body.Close()
	st, err := readExecEvents(resp.Body, stdout, stderr)
	if err != nil {
		return st, ctxErr(ctx, err)
	}
	return st, nil
}

func readExecEvents(r io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error) {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 64<<10))
	for {
		var ev api.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			return api.ExitStatus{}, fmt.Errorf("exec stream ended without an exit status: %w", err)
		}
		switch {
		case ev.Exit != nil:
			return *ev.Exit, nil
		case ev.Error != nil:
			return api.ExitStatus{}, api.ToError(*ev.Error)
		}
		if _, err := stdout.Write(ev.Stdout); err != nil {
			return api.ExitStatus{}, err
		}
		if _, err := stderr.Write(ev.Stderr); err != nil {
			return api.ExitStatus{}, err
		}
	}
}

// CopyTo sends a tar stream into the sandbox at dest.
func (c *Client) CopyTo(ctx context.Context, id, dest string, tarStream io.Reader) (rootfs.ExtractResult, error) {
	return c.CopyToParents(ctx, id, dest, tarStream, false)
}

// CopyToParents is CopyTo that, with parents, first makes dest's missing parent directories.
func (c *Client) CopyToParents(ctx context.Context, id, dest string, tarStream io.Reader, parents bool) (rootfs.ExtractResult, error) {
	var res rootfs.ExtractResult
	q := url.Values{"path": {dest}}
	if parents {
		q.Set("parents", "true")
	}
	resp, err := c.sendRaw(ctx, http.MethodPut, "/sandboxes/"+url.PathEscape(id)+"/files?"+q.Encode(), tarStream, "application/x-tar")
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	return res, json.NewDecoder(resp.Body).Decode(&res)
}

// CopyFrom returns a tar stream of src in the sandbox; the caller closes it.
func (c *Client) CopyFrom(ctx context.Context, id, src string) (io.ReadCloser, error) {
	resp, err := c.sendRaw(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/files?path="+url.QueryEscape(src), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Adopt makes a quarantined sandbox leased again (in pool, or the pool it was known by).
func (c *Client) Adopt(ctx context.Context, id, pool string) (api.Sandbox, error) {
	var s api.Sandbox
	return s, c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/adopt", api.AdoptRequest{Pool: pool}, &s)
}

// DestroyQuarantined destroys a quarantined sandbox with its checkpoints and state.
func (c *Client) DestroyQuarantined(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/destroy", struct{}{}, nil)
}
