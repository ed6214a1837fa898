package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/version"
)

// Exit codes of the CLI (docs/design.md, "Contracts"); exec exits with the command's own.
const (
	exitOK    = 0
	exitError = 1
)

// run runs the call and returns the exit code, printing as deltabox-cli does.
func (c call) run(stdout, stderr io.Writer) int {
	var err error
	code := exitOK
	switch c.verb {
	case "version":
		io.WriteString(stdout, "deltabox version "+version.Version+" ("+version.Commit+")\n")
		return exitOK
	case "lease":
		err = c.lease(stdout)
	case "exec":
		code, err = c.exec(stdout, stderr)
	}
	if err != nil {
		printError(stderr, err)
		return exitError
	}
	return code
}

// request dials the daemon and sends one request; the caller reads the body (the process
// exits after it: the connection is never closed by hand).
func (c call) request(method, path, contentType string, body []byte) (*response, error) {
	conn, err := dial(c.address)
	if err == nil {
		var resp *response
		if resp, err = roundTrip(conn, method, path, contentType, body); err == nil {
			if resp.code >= 300 {
				return nil, decodeError(resp)
			}
			return resp, nil
		}
	}
	// client.sendRaw's words for a failed round trip.
	return nil, &classError{msg: "cannot reach the DeltaBox daemon at " + c.address + " (is `deltabox daemon` running?): " +
		err.Error() + ": unavailable", classes: []error{errdefs.ErrUnavailable}}
}

// decodeError is the client's decodeError: the API's error body, or the status and the body
// as it came.
func decodeError(resp *response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.body, 1<<20))
	v, err := parseJSON(data)
	e := getObject(asObject(v), "error")
	if err != nil || getString(e, "code") == "" {
		class := statusClass(resp.code)
		return &classError{msg: "daemon answered " + resp.status + ": " + string(bytes.TrimSpace(data)) + ": " + class.Error(),
			classes: []error{class}}
	}
	return apiError(getString(e, "code"), getString(e, "message"), resp.code)
}

func asObject(v any) map[string]any { m, _ := v.(map[string]any); return m }

// lease is `deltabox lease --pool NAME`: POST /v1/pools/NAME/lease with an empty request,
// and the sandbox's ID on a line.
func (c call) lease(stdout io.Writer) error {
	path := "/pools/" + c.pool + "/lease"
	resp, err := c.request("POST", path, "application/json", []byte("{}"))
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.body)
	var v any
	if err == nil {
		v, err = parseJSON(data)
	}
	l := asObject(v)
	if err == nil && l == nil {
		err = errors.New("not a JSON object")
	}
	if err != nil {
		return errors.New("decode POST " + path + " response: " + err.Error())
	}
	_, err = io.WriteString(stdout, getString(l, "sandbox")+"\n")
	return err
}

// exec is `deltabox exec [--output-cap N] ID CMD [ARGS...]` without stdin: POST
// /v1/sandboxes/ID/exec with the request line, then the output events as they come
// (client.Exec and cmd/deltabox's runExec).
func (c call) exec(stdout, stderr io.Writer) (int, error) {
	body := []byte(`{"argv":[`)
	for i, a := range c.argv {
		if i > 0 {
			body = append(body, ',')
		}
		body = appendJSONString(body, a)
	}
	body = append(body, ']')
	if c.outputCap != 0 {
		body = strconv.AppendInt(append(body, `,"output_cap":`...), c.outputCap, 10)
	}
	body = append(body, "}\n"...)
	resp, err := c.request("POST", "/sandboxes/"+c.id+"/exec", "application/x-ndjson", body)
	if err != nil {
		return 0, err
	}
	st, err := readExecEvents(resp.body, stdout, stderr)
	if err != nil {
		return 0, err
	}
	if msg := getString(st, "error"); msg != "" {
		io.WriteString(stderr, "deltabox: "+strings.TrimSpace(msg)+"\n")
	} else if getBool(st, "timed_out") {
		io.WriteString(stderr, "deltabox: command timed out after 0s and was killed\n") // no --timeout here
	}
	var cut []string
	if getBool(st, "stdout_truncated") {
		cut = append(cut, "stdout")
	}
	if getBool(st, "stderr_truncated") {
		cut = append(cut, "stderr")
	}
	if len(cut) > 0 {
		io.WriteString(stderr, "deltabox: "+strings.Join(cut, " and ")+" cut at "+strconv.FormatInt(c.outputCap, 10)+
			" bytes (--output-cap); the rest was dropped\n")
	}
	return getInt(st, "code"), nil
}

// readExecEvents is the client's: one JSON event a line ({"o": base64}, {"e": base64},
// {"exit": {...}} or {"error": {...}}), output written as it comes, up to the exit status.
func readExecEvents(body io.Reader, stdout, stderr io.Writer) (map[string]any, error) {
	r := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) == 0 {
			if err == nil {
				continue
			}
			if err == io.EOF && len(line) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, errors.New("exec stream ended without an exit status: " + err.Error())
		}
		v, perr := parseJSON(line)
		ev := asObject(v)
		if perr == nil && ev == nil {
			perr = errors.New("an exec event is not a JSON object")
		}
		if perr != nil {
			return nil, errors.New("exec stream ended without an exit status: " + perr.Error())
		}
		if st := getObject(ev, "exit"); st != nil {
			return st, nil
		}
		if e := getObject(ev, "error"); e != nil {
			return nil, apiError(getString(e, "code"), getString(e, "message"), 0)
		}
		if err := writeB64(stdout, getString(ev, "o")); err != nil {
			return nil, err
		}
		if err := writeB64(stderr, getString(ev, "e")); err != nil {
			return nil, err
		}
	}
}

func writeB64(w io.Writer, s string) error {
	if s == "" {
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}
