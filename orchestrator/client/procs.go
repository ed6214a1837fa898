package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// ExecDetached starts a command in a sandbox without waiting for it (req.Detach is set) and
// returns its proc; Logs reads its output.
func (c *Client) ExecDetached(ctx context.Context, id string, req api.ExecRequest) (api.Proc, error) {
	req.Detach, req.Stdin = true, false
	line, err := json.Marshal(req)
	if err != nil {
		return api.Proc{}, err
	}
	resp, err := c.sendRaw(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/exec", bytes.NewReader(append(line, '\n')), "application/x-ndjson")
	if err != nil {
		return api.Proc{}, err
	}
	defer resp.Body.Close()
	var ev api.ExecEvent
	if err := json.NewDecoder(resp.Body).Decode(&ev); err != nil {
		return api.Proc{}, fmt.Errorf("read the detached exec's answer: %w", err)
	}
	switch {
	case ev.Error != nil:
		return api.Proc{}, api.ToError(*ev.Error)
	case ev.Detached == nil:
		return api.Proc{}, fmt.Errorf("the daemon did not detach the exec (is it older than this client?)")
	}
	return *ev.Detached, nil
}

// Procs lists a sandbox's detached execs, oldest first.
func (c *Client) Procs(ctx context.Context, id string) ([]api.Proc, error) {
	var ps []api.Proc
	return ps, c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/procs", nil, &ps)
}

// Logs writes a detached exec's output so far to stdout and stderr; with follow it waits for
// the command to end. The exit status is nil while the command still runs.
func (c *Client) Logs(ctx context.Context, id, proc string, follow bool, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	path := fmt.Sprintf("/sandboxes/%s/procs/%s/logs?follow=%t", url.PathEscape(id), url.PathEscape(proc), follow)
	resp, err := c.sendRaw(ctx, http.MethodGet, path, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))
	for {
		var ev api.ExecEvent
		if err := dec.Decode(&ev); errors.Is(err, io.EOF) {
			return nil, nil
		} else if err != nil {
			return nil, ctxErr(ctx, fmt.Errorf("read the log of %s: %w", proc, err))
		}
		switch {
		case ev.Exit != nil:
			return ev.Exit, nil
		case ev.Error != nil:
			return nil, api.ToError(*ev.Error)
		}
		if _, err := stdout.Write(ev.Stdout); err != nil {
			return nil, err
		}
		if _, err := stderr.Write(ev.Stderr); err != nil {
			return nil, err
		}
	}
}
