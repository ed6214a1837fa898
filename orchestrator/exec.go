package orchestrator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// maxExecHeader bounds the JSON line that starts an exec request.
const maxExecHeader = 1 << 20

// exec runs a command in a sandbox and streams its output as JSON lines (api.ExecEvent).
func (o *Orchestrator) exec(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	body := bufio.NewReaderSize(r.Body, 64<<10)
	req, err := readExecRequest(body)
	var s *session
	if err == nil { // the sandbox's first checkpoint must be taken before anything runs
		s, err = o.session(ctx, id)
	}
	if err != nil {
		writeError(ctx, w, err)
		return
	}
	if req.Detach {
		p, err := o.startDetached(ctx, s, req)
		if err != nil {
			writeError(ctx, w, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		(&eventWriter{w: w, rc: http.NewResponseController(w)}).send(api.ExecEvent{Detached: &p})
		return
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	ew := &eventWriter{w: w, rc: http.NewResponseController(w)}
	var stdin io.Reader
	if req.Stdin {
		stdin = body
	}
	step := o.beginStep(s, req)
	stdout, stderr := ew.stream(false), ew.stream(true)
	if step != nil {
		stdout, stderr = &teeWriter{w: stdout, c: step.stdout}, &teeWriter{w: stderr, c: step.stderr}
	}
	st, err := o.pools.Exec(ctx, id, pool.ExecRequest{
		Argv: req.Argv, Env: req.Env, Workdir: req.Workdir, User: req.User,
		Timeout: time.Duration(req.TimeoutMS * float64(time.Millisecond)), OutputCap: req.OutputCap, Tag: req.Tag, Via: req.Via,
	}, stdin, stdout, stderr)
	if err != nil {
		o.endStep(ctx, s, step, nil, err)
		code, _ := api.FromError(err)
		ew.send(api.ExecEvent{Error: &api.Error{Code: code, Message: err.Error()}})
		return
	}
	exit := apiExitStatus(st)
	o.endStep(ctx, s, step, &exit, nil)
	ew.send(api.ExecEvent{Exit: &exit})
}

// maxExecTimeoutMS bounds an exec's timeout_ms (a larger one would overflow a time.Duration).
const maxExecTimeoutMS = 100 * 24 * 3600 * 1000

func readExecRequest(r *bufio.Reader) (api.ExecRequest, error) {
	var req api.ExecRequest
	line, err := r.ReadSlice('\n')
	if err != nil && !(err == io.EOF && len(line) > 0) {
		return req, fmt.Errorf("read exec request line (at most %d bytes): %v: %w", maxExecHeader, err, errdefs.ErrInvalidArgument)
	}
	if err := decodeOne(bytes.NewReader(line), &req); err != nil {
		return req, fmt.Errorf("decode exec request: %w", err)
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return req, fmt.Errorf("exec needs a command: %w", errdefs.ErrInvalidArgument)
	}
	if req.TimeoutMS < 0 || req.OutputCap < 0 {
		return req, fmt.Errorf("timeout and output cap must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	if req.TimeoutMS > maxExecTimeoutMS {
		return req, fmt.Errorf("timeout_ms %g: at most %d (100 days): %w", req.TimeoutMS, int64(maxExecTimeoutMS), errdefs.ErrInvalidArgument)
	}
	return req, pool.ValidateEnv(req.Env)
}

// eventWriter serialises exec events onto the response and flushes each one.
type eventWriter struct {
	mu sync.Mutex
	w  io.Writer
	rc *http.ResponseController
}

func (e *eventWriter) send(ev api.ExecEvent) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.w.Write(append(data, '\n')); err != nil {
		return err
	}
	return e.rc.Flush()
}

type streamWriter struct {
	e      *eventWriter
	stderr bool
}

func (e *eventWriter) stream(stderr bool) io.Writer { return streamWriter{e: e, stderr: stderr} }

func (s streamWriter) Write(p []byte) (int, error) {
	ev := api.ExecEvent{Stdout: p}
	if s.stderr {
		ev = api.ExecEvent{Stderr: p}
	}
	if err := s.e.send(ev); err != nil {
		return 0, err
	}
	return len(p), nil
}
