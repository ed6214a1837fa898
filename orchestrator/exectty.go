package orchestrator

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/initproto"
)

// execTTY runs a command on a terminal in a sandbox (POST /v1/sandboxes/{id}/exec/tty): the
// body is the request line, then api.TTYInput lines (typed bytes, window sizes, end of
// input); the answer streams api.ExecEvent lines as exec does, the terminal's output in
// stdout events.
func (o *Orchestrator) execTTY(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	body := bufio.NewReaderSize(r.Body, api.MaxTTYInputLine)
	req, err := readExecRequest(body)
	if err == nil {
		err = checkTTYRequest(req)
	}
	var s *session
	if err == nil { // the sandbox's first checkpoint must be taken before anything runs
		s, err = o.session(ctx, id)
	}
	if err != nil {
		writeError(ctx, w, err)
		return
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	ew := &eventWriter{w: w, rc: http.NewResponseController(w)}
	_ = ew.rc.Flush() // the client gets the answer's head before the command prints anything
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	input := make(chan initproto.TTYInput)
	go readTTYInput(body, req.Stdin, input, ctx.Done(), cancel)
	step := o.beginStep(s, req)
	out := ew.stream(false)
	if step != nil {
		out = &teeWriter{w: out, c: step.stdout}
	}
	st, err := o.pools.ExecTTY(ctx, id, poolExecRequest(req), ttySize(req.TTY), input, out)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause // a bad input line ended the exec: say so rather than "context canceled"
	}
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

// checkTTYRequest refuses what a terminal exec cannot do.
func checkTTYRequest(req api.ExecRequest) error {
	switch {
	case req.TTY == nil:
		return fmt.Errorf("exec/tty needs the terminal's size (\"tty\": {\"rows\": R, \"cols\": C}; {} takes 24x80): %w", errdefs.ErrInvalidArgument)
	case req.Detach:
		return fmt.Errorf("a terminal exec cannot be detached: %w", errdefs.ErrInvalidArgument)
	case req.Via != "" && req.Via != "init":
		return fmt.Errorf("exec on a terminal via %q: only the sandbox init hosts terminals: %w", req.Via, errdefs.ErrInvalidArgument)
	}
	return nil
}

func ttySize(s *api.TTYSize) initproto.WinSize {
	if s == nil {
		return initproto.WinSize{}
	}
	return initproto.WinSize{Rows: s.Rows, Cols: s.Cols}
}

func poolExecRequest(req api.ExecRequest) pool.ExecRequest {
	return pool.ExecRequest{
		Argv: req.Argv, Env: req.Env, Workdir: req.Workdir, User: req.User,
		Timeout: time.Duration(req.TimeoutMS * float64(time.Millisecond)), OutputCap: req.OutputCap, Tag: req.Tag, Via: req.Via,
	}
}

// readTTYInput turns the body's api.TTYInput lines into terminal input until the body ends
// or an eof line (then input is closed: the terminal's EOF is typed), or done. Typed bytes
// are dropped unless stdin is set. A malformed line cancels the exec with its reason.
func readTTYInput(body *bufio.Reader, stdin bool, input chan<- initproto.TTYInput, done <-chan struct{}, cancel context.CancelCauseFunc) {
	for {
		line, err := body.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			cancel(fmt.Errorf("terminal input line over %d bytes: %w", api.MaxTTYInputLine, errdefs.ErrInvalidArgument))
			return
		}
		if len(bytes.TrimSpace(line)) == 0 {
			if err != nil { // the body ended (io.EOF) or broke: the input ends
				endTTYInput(stdin, input)
				return
			}
			continue
		}
		var m api.TTYInput
		if derr := decodeOne(bytes.NewReader(line), &m); derr != nil {
			cancel(fmt.Errorf("terminal input line: %w", derr))
			return
		}
		if m.EOF {
			endTTYInput(stdin, input)
			return
		}
		if in, ok := initTTYInput(m, stdin); ok && !sendTTY(input, in, done) {
			return
		}
		if err != nil {
			endTTYInput(stdin, input)
			return
		}
	}
}

// initTTYInput converts one input message; ok is false when nothing is left to send.
func initTTYInput(m api.TTYInput, stdin bool) (initproto.TTYInput, bool) {
	var in initproto.TTYInput
	if stdin {
		in.Data = m.Stdin
	}
	if m.Resize != nil {
		ws := ttySize(m.Resize)
		in.Size = &ws
	}
	return in, len(in.Data) > 0 || in.Size != nil
}

func sendTTY(input chan<- initproto.TTYInput, in initproto.TTYInput, done <-chan struct{}) bool {
	select {
	case input <- in:
		return true
	case <-done:
		return false
	}
}

// endTTYInput closes the input when the client streams stdin (the terminal's EOF is typed);
// without stdin nothing is typed, and input stays open until the command ends.
func endTTYInput(stdin bool, input chan<- initproto.TTYInput) {
	if stdin {
		close(input)
	}
}

// ExecTTY runs a command on a terminal in a leased sandbox (as POST .../exec/tty does, for
// gateways): input carries typed bytes and window sizes until it is closed (the terminal's
// EOF is typed), and the terminal's output goes to out. A sender on input must stop when the
// call returns. started, when not nil, gets the command's pid in the sandbox once it runs,
// before any output (not when the sandbox's init predates start reports on terminals).
func (o *Orchestrator) ExecTTY(ctx context.Context, id string, req api.ExecRequest, started func(pid int), input <-chan api.TTYInput, out io.Writer) (api.ExitStatus, error) {
	if err := checkTTYRequest(req); err != nil {
		return api.ExitStatus{}, err
	}
	if _, err := o.session(ctx, id); err != nil {
		return api.ExitStatus{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := make(chan initproto.TTYInput)
	go func() {
		for {
			select {
			case m, ok := <-input:
				if v, more := initTTYInput(m, true); ok && more && !sendTTY(in, v, ctx.Done()) {
					return
				}
				if !ok || m.EOF {
					close(in)
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	preq := poolExecRequest(req)
	preq.Started = started
	st, err := o.pools.ExecTTY(ctx, id, preq, ttySize(req.TTY), in, out)
	return apiExitStatus(st), err
}
