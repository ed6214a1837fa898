package initproto

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/containerd/errdefs"
)

// TTYInput is one piece of a terminal exec's input: bytes typed on the terminal (Data) or a
// new window size (Size), or both (the size is applied first).
type TTYInput struct {
	Data []byte
	Size *WinSize
}

// ExecTTY runs req on a new pseudo-terminal in the sandbox (OpExecTTY) and streams what the
// terminal shows to out (stdout and stderr are one stream; nil discards). req.TTY is the
// initial window size (nil: 24x80). Input comes from input until it is closed, which types
// the terminal's EOF character (Ctrl-D); a nil input sends nothing. The goroutine reading
// input stops when the command has exited, so a sender must not block on the channel past
// the call's return (select on its own done channel). Cancelling ctx closes the connection,
// which makes the init kill the command's process group; req.OutputCap bounds out as for Exec.
//
// An init that predates terminals answers with a failed_precondition error.
func (c *Client) ExecTTY(ctx context.Context, req ExecRequest, input <-chan TTYInput, out io.Writer) (ExitStatus, error) {
	return c.ExecTTYNotify(ctx, req, nil, input, out)
}

// ExecTTYNotify is ExecTTY that calls started with the command's pid in the sandbox once it
// runs, before any output (not at all when it could not be started, or when the init
// predates FrameStarted on terminals).
func (c *Client) ExecTTYNotify(ctx context.Context, req ExecRequest, started func(pid int), input <-chan TTYInput, out io.Writer) (ExitStatus, error) {
	if len(req.Argv) == 0 {
		return ExitStatus{}, fmt.Errorf("exec: empty argv: %w", errdefs.ErrInvalidArgument)
	}
	ws := WinSize{}
	if req.TTY != nil {
		ws = *req.TTY
	}
	ws = ws.WithDefaults()
	req.TTY, req.Stdin = &ws, true
	req.ReportStart = started != nil
	conn, done, err := c.open(ctx)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("exec %q on a terminal: %w", req.Argv[0], err)
	}
	defer done()
	if err := sendRequest(conn, Request{Op: OpExecTTY, Exec: &req}); err != nil {
		return ExitStatus{}, fmt.Errorf("exec %q on a terminal: %w", req.Argv[0], ctxErr(ctx, err))
	}
	stop := make(chan struct{})
	defer close(stop)
	if input != nil {
		go sendTTYInput(conn, input, stop)
	}
	st, err := readExec(conn, req.OutputCap, started, out, nil)
	if err != nil {
		if errdefs.IsInvalidArgument(err) && strings.Contains(err.Error(), "unknown op") {
			err = fmt.Errorf("the sandbox's init predates terminal support (a sandbox restored from an older snapshot): %v: %w", err, errdefs.ErrFailedPrecondition)
		}
		return ExitStatus{}, fmt.Errorf("exec %q on a terminal: %w", req.Argv[0], ctxErr(ctx, err))
	}
	return st, nil
}

// sendTTYInput turns input into frames until input is closed (then the EOF frame) or stop.
// Write errors end it quietly: the exec is over or cancelled.
func sendTTYInput(conn net.Conn, input <-chan TTYInput, stop <-chan struct{}) {
	for {
		var in TTYInput
		var ok bool
		select {
		case in, ok = <-input:
		case <-stop:
			return
		}
		if !ok {
			_ = WriteFrame(conn, FrameStdinEOF, nil)
			return
		}
		if in.Size != nil {
			if WriteFrame(conn, FrameResize, EncodeResize(*in.Size)) != nil {
				return
			}
		}
		for p := in.Data; len(p) > 0; {
			n := min(len(p), stdinChunk)
			if WriteFrame(conn, FrameStdin, p[:n]) != nil {
				return
			}
			p = p[n:]
		}
	}
}
