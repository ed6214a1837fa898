package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// ttyChunk is the most input one api.TTYInput line carries (base64 keeps the line under
// api.MaxTTYInputLine).
const ttyChunk = 32 << 10

// ExecTTY runs a command on a terminal in a sandbox (POST /v1/sandboxes/{id}/exec/tty) and
// returns its exit status. req.TTY is the initial window size (nil: 24x80); with req.Stdin
// the Stdin bytes of input are typed on the terminal. Closing input ends the input (the
// terminal's EOF, Ctrl-D, is typed). What the terminal shows goes to out.
func (c *Client) ExecTTY(ctx context.Context, id string, req api.ExecRequest, input <-chan api.TTYInput, out io.Writer) (api.ExitStatus, error) {
	if req.TTY == nil {
		req.TTY = &api.TTYSize{}
	}
	line, err := json.Marshal(req)
	if err != nil {
		return api.ExitStatus{}, err
	}
	pr, pw := io.Pipe()
	stop := make(chan struct{})
	defer close(stop)
	defer pw.Close()
	go writeTTYInput(pw, append(line, '\n'), input, stop)
	resp, err := c.sendRaw(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/exec/tty", pr, "application/x-ndjson")
	if err != nil {
		return api.ExitStatus{}, err
	}
	defer resp.Body.Close()
	st, err := readExecEvents(resp.Body, out, io.Discard)
	if err != nil {
		return st, ctxErr(ctx, err)
	}
	return st, nil
}

// writeTTYInput writes the request line, then the input's JSON lines, until input is closed
// or an EOF message (then an eof line ends the input), or stop.
func writeTTYInput(pw *io.PipeWriter, head []byte, input <-chan api.TTYInput, stop <-chan struct{}) {
	if _, err := pw.Write(head); err != nil {
		return
	}
	enc := json.NewEncoder(pw)
	for {
		var m api.TTYInput
		var ok bool
		select {
		case m, ok = <-input:
		case <-stop:
			return
		}
		if !ok {
			m = api.TTYInput{EOF: true}
		}
		if encodeTTYInput(enc, m) != nil || m.EOF {
			return
		}
	}
}

// encodeTTYInput writes m as one line, or several when its input is longer than ttyChunk.
func encodeTTYInput(enc *json.Encoder, m api.TTYInput) error {
	data := m.Stdin
	for {
		part := api.TTYInput{Resize: m.Resize, Stdin: data[:min(len(data), ttyChunk)]}
		data = data[len(part.Stdin):]
		m.Resize = nil
		part.EOF = m.EOF && len(data) == 0
		if err := enc.Encode(part); err != nil {
			return err
		}
		if len(data) == 0 {
			return nil
		}
	}
}
