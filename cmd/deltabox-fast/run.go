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
	case "checkpoint":
		err = c.checkpoint(stdout)
	case "rollback":
		err = c.rollback(stdout)
	case "release":
		code, err = c.release(stdout, stderr)
	}
	if err != nil {
		c.printError(stderr, err)
		return exitError
	}
	return code
}

// printError is deltabox-cli's printError for an error the call ends with (exit 1).
func (c call) printError(stderr io.Writer, err error) {
	if c.json {
		printJSONError(stderr, err, exitError)
	} else {
		printError(stderr, err)
	}
}

// result reads a successful answer's JSON body, decoded, and the body itself; errors read
// as client.do's decode errors.
func (c call) result(method, path string, body []byte) (map[string]any, []byte, error) {
	resp, err := c.request(method, path, "application/json", body)
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(resp.body)
	var v any
	if err == nil {
		v, err = parseJSON(data)
	}
	m := asObject(v)
	if err == nil && m == nil {
		err = errors.New("not a JSON object")
	}
	if err != nil {
		return nil, nil, errors.New("decode " + method + " " + path + " response: " + err.Error())
	}
	return m, data, nil
}

// printJSON prints a result body as deltabox-cli's printResult does with -o json: the
// decoded value encoded again, indented by two spaces, and a newline.
func printJSON(stdout io.Writer, data []byte) error {
	out, err := reencode(make([]byte, 0, len(data)+len(data)/2), data, true)
	if err != nil {
		return err
	}
	_, err = stdout.Write(append(out, '\n'))
	return err
}

// request dials the daemon and sends one request, or takes the one the C front sent
// (handover.go); the caller reads the body (the process exits after it: the connection is
// never closed by hand).
func (c call) request(method, path, contentType string, body []byte) (*response, error) {
	var resp *response
	var err error
	if h := sentByC; h != nil { // the C front sent this request: read on from where it stopped
		sentByC = nil
		resp, err = h.response(c.address)
	} else if conn, derr := dial(c.address); derr != nil {
		err = derr
	} else {
		resp, err = roundTrip(conn, method, path, contentType, body)
	}
	if err == nil {
		if resp.code >= 300 {
			return nil, decodeError(resp)
		}
		return resp, nil
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
	l, data, err := c.result("POST", "/pools/"+c.pool+"/lease", []byte("{}"))
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, data)
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
	if c.json { // JSON lines, as cmd/deltabox's jsonLines: {"stdout": ...}, {"stderr": ...}, {"exit": {...}}
		stdout, stderr = jsonStream{stdout, "stdout"}, jsonStream{stdout, "stderr"}
	}
	st, err := readExecEvents(resp.body, stdout, stderr)
	if err != nil {
		return 0, err
	}
	if c.json {
		out, err := reencode([]byte(`{"exit":`), st.raw, false)
		if err != nil {
			return 0, err
		}
		stdout.(jsonStream).w.Write(append(out, "}\n"...))
		return getInt(st.m, "code"), nil
	}
	return c.execText(st.m, stderr), nil
}

// jsonStream writes each chunk as a JSON line {"NAME": "chunk"} (cmd/deltabox's jsonStream).
type jsonStream struct {
	w    io.Writer
	name string
}

func (s jsonStream) Write(p []byte) (int, error) {
	if len(p) > 0 {
		b := append(appendJSONString([]byte{'{'}, s.name), ':')
		if _, err := s.w.Write(append(appendJSONString(b, string(p)), '}', '\n')); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// execText reports an exit status on stderr as runExec does in text output and returns its
// exit code.
func (c call) execText(st map[string]any, stderr io.Writer) int {
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
	return getInt(st, "code")
}

// exitStatus is the exit event's status, decoded and as it came.
type exitStatus struct {
	m   map[string]any
	raw []byte
}

// readExecEvents is the client's: one JSON event a line ({"o": base64}, {"e": base64},
// {"exit": {...}} or {"error": {...}}), output written as it comes, up to the exit status.
func readExecEvents(body io.Reader, stdout, stderr io.Writer) (exitStatus, error) {
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
			return exitStatus{}, errors.New("exec stream ended without an exit status: " + err.Error())
		}
		v, perr := parseJSON(line)
		ev := asObject(v)
		if perr == nil && ev == nil {
			perr = errors.New("an exec event is not a JSON object")
		}
		if perr != nil {
			return exitStatus{}, errors.New("exec stream ended without an exit status: " + perr.Error())
		}
		if st := getObject(ev, "exit"); st != nil {
			return exitStatus{st, rawMember(line, "exit")}, nil
		}
		if e := getObject(ev, "error"); e != nil {
			return exitStatus{}, apiError(getString(e, "code"), getString(e, "message"), 0)
		}
		if err := writeB64(stdout, getString(ev, "o")); err != nil {
			return exitStatus{}, err
		}
		if err := writeB64(stderr, getString(ev, "e")); err != nil {
			return exitStatus{}, err
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

// sandboxPath is client.sandboxPath for an ID that needs no escaping.
func sandboxPath(id, suffix string) string { return "/sandboxes/" + id + suffix }

// checkpoint is `deltabox checkpoint create ID [flags]`.
func (c call) checkpoint(stdout io.Writer) error {
	ck, data, err := c.result("POST", sandboxPath(c.id, "/checkpoints"), c.body)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, data)
	}
	b := []byte("checkpoint " + getString(ck, "checkpoint") + " (" + getString(ck, "level") + "): " + getNum(ck, "files_changed") +
		" files, " + getNum(ck, "bytes") + " bytes, frozen " + getMS(ck, "frozen_ms") + " ms, total " + getMS(ck, "total_ms") + " ms\n")
	for _, v := range getArray(ck, "processes") { // printProcesses
		p := asObject(v)
		b = append(b, "process "+getNum(p, "pid")+" ("+getString(p, "comm")+"): "+getString(p, "kept")...)
		if r := getString(p, "reason"); r != "" {
			b = append(b, " ("+r+")"...)
		}
		b = append(b, '\n')
	}
	_, err = stdout.Write(b)
	return err
}

// rollback is `deltabox rollback ID [--to CKPT] [--force] [--replay]`.
func (c call) rollback(stdout io.Writer) error {
	res, data, err := c.result("POST", sandboxPath(c.id, "/rollback"), c.body)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, data)
	}
	b := []byte("rolled back to " + getString(res, "to") + ": " + getNum(res, "files_restored") + " files restored, " +
		getNum(res, "ops_undone") + " state ops undone, " + getNum(res, "effects_dropped") + " effects dropped, " +
		getNum(res, "processes_stopped") + " processes stopped, " + getNum(res, "processes_restored") + " restored, frozen " +
		getMS(res, "frozen_ms") + " ms, total " + getMS(res, "total_ms") + " ms\n")
	for _, v := range getArray(res, "processes_lost") {
		p := asObject(v)
		b = append(b, "not restored: pid "+getNum(p, "pid")+" ("+getString(p, "comm")+"): "+getString(p, "reason")+"\n"...)
	}
	_, err = stdout.Write(b)
	return err
}

// release is `deltabox release ID [ID...]` (cmd/deltabox's forEachID): it goes on after a
// failure, prints each ID released (with -o json one document: {"released": ID} for one ID,
// a list of them for several), reports each failure on stderr and exits 1 if any failed.
func (c call) release(stdout, stderr io.Writer) (int, error) {
	code := exitOK
	var done []string
	for _, id := range c.ids {
		resp, err := c.request("POST", sandboxPath(id, "/release"), "application/json", nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.body)
		}
		if err != nil {
			if len(c.ids) == 1 {
				return 0, err
			}
			c.printError(stderr, &classError{msg: id + ": " + err.Error(), classes: []error{err}})
			code = exitError
			continue
		}
		done = append(done, id)
		if !c.json {
			io.WriteString(stdout, id+"\n")
		}
	}
	if c.json {
		b := []byte("[]")
		if len(c.ids) == 1 {
			b = appendJSONString([]byte(`{"released":`), done[0])
			b = append(b, '}')
		} else if len(done) > 0 {
			b = []byte{'['}
			for i, id := range done {
				if i > 0 {
					b = append(b, ',')
				}
				b = append(appendJSONString(append(b, `{"released":`...), id), '}')
			}
			b = append(b, ']')
		}
		if err := printJSON(stdout, b); err != nil {
			return 0, err
		}
	}
	return code, nil
}
