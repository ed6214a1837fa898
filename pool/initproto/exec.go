package initproto

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"

	"github.com/containerd/errdefs"
)

const stdinChunk = 32 << 10

// Exec runs req in the sandbox and streams its output to stdout and stderr (nil discards)
// as it arrives. When stdin is not nil it is streamed to the command and closed at its EOF;
// the caller must make sure a blocking stdin ends (the goroutine copying it may otherwise
// outlive the call). Cancelling ctx closes the connection, which makes the init kill the
// command's process group. The client enforces req.OutputCap on its side too, so a hostile
// sandbox cannot push more than that into the writers.
//
// A command that ran (whatever its exit code) or could not be started returns a nil error
// and the status; errors are transport, protocol or request failures.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (ExitStatus, error) {
	return c.ExecNotify(ctx, req, nil, stdin, stdout, stderr)
}

// ExecNotify is Exec that calls started with the command's pid in the sandbox once it runs,
// before any output (not at all when it could not be started, or when the init predates
// FrameStarted).
func (c *Client) ExecNotify(ctx context.Context, req ExecRequest, started func(pid int), stdin io.Reader, stdout, stderr io.Writer) (ExitStatus, error) {
	if len(req.Argv) == 0 {
		return ExitStatus{}, fmt.Errorf("exec: empty argv: %w", errdefs.ErrInvalidArgument)
	}
	req.Stdin = stdin != nil
	req.ReportStart = started != nil
	conn, done, err := c.open(ctx)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("exec %q: %w", req.Argv[0], err)
	}
	defer done()
	if err := sendRequest(conn, Request{Op: OpExec, Exec: &req}); err != nil {
		return ExitStatus{}, fmt.Errorf("exec %q: %w", req.Argv[0], ctxErr(ctx, err))
	}
	if stdin != nil {
		go sendStdin(conn, stdin)
	}
	st, err := readExec(conn, req.OutputCap, started, stdout, stderr)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("exec %q: %w", req.Argv[0], ctxErr(ctx, err))
	}
	return st, nil
}

// Attach follows the detached exec named key again (see ExecRequest.Detach): its output from
// the offsets in from (bytes of stdout and stderr the caller already has) to stdout and
// stderr, then its exit status. Output the init no longer holds is skipped and the status
// says the stream was truncated. A key the init does not hold fails with a not-found error.
// Cancelling ctx leaves the command running.
func (c *Client) Attach(ctx context.Context, key string, from [2]int64, stdout, stderr io.Writer) (ExitStatus, error) {
	conn, done, err := c.open(ctx)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("attach %q: %w", key, err)
	}
	defer done()
	if err := sendRequest(conn, Request{Op: OpAttach, Attach: &AttachRequest{Key: key, From: from}}); err != nil {
		return ExitStatus{}, fmt.Errorf("attach %q: %w", key, ctxErr(ctx, err))
	}
	st, err := readExec(conn, 0, nil, stdout, stderr)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("attach %q: %w", key, ctxErr(ctx, err))
	}
	return st, nil
}

// sendStdin copies r to the connection as stdin frames, then sends the EOF frame. Errors end
// it quietly: a write error means the exec is over or cancelled.
func sendStdin(conn net.Conn, r io.Reader) {
	buf := make([]byte, stdinChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := WriteFrame(conn, FrameStdin, buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			break
		}
	}
	_ = WriteFrame(conn, FrameStdinEOF, nil)
}

// readExec reads output frames until the exit frame.
func readExec(conn net.Conn, limit int64, started func(int), stdout, stderr io.Writer) (ExitStatus, error) {
	out, errw := newCapWriter(stdout, limit), newCapWriter(stderr, limit)
	r := bufio.NewReaderSize(conn, 64<<10)
	var buf []byte
	for {
		t, payload, err := ReadFrame(r, &buf)
		if err != nil {
			return ExitStatus{}, readError(err)
		}
		switch t {
		case FrameStdout:
			err = out.write(payload)
		case FrameStderr:
			err = errw.write(payload)
		case FrameStarted:
			var st Started
			if err := DecodeJSON(payload, &st); err != nil {
				return ExitStatus{}, err
			}
			if started != nil {
				started(st.Pid)
			}
		case FrameExit:
			return exitStatus(payload, out.truncated, errw.truncated)
		case FrameError:
			return ExitStatus{}, decodeError(payload)
		default:
			return ExitStatus{}, fmt.Errorf("unexpected frame type %d: %w", t, ErrProtocol)
		}
		if err != nil {
			return ExitStatus{}, fmt.Errorf("write output: %w", err)
		}
	}
}

func exitStatus(payload []byte, outTrunc, errTrunc bool) (ExitStatus, error) {
	var st ExitStatus
	if err := DecodeJSON(payload, &st); err != nil {
		return ExitStatus{}, err
	}
	st.Error, st.Signal = clip(st.Error), clip(st.Signal)
	st.StdoutTruncated = st.StdoutTruncated || outTrunc
	st.StderrTruncated = st.StderrTruncated || errTrunc
	return st, nil
}

// capWriter passes on at most left bytes of what it is given, unless unlimited.
type capWriter struct {
	w         io.Writer
	left      int64
	unlimited bool
	truncated bool
}

// newCapWriter caps w at limit bytes (limit <= 0: unlimited; nil w: discard).
func newCapWriter(w io.Writer, limit int64) *capWriter {
	if w == nil {
		w = io.Discard
	}
	return &capWriter{w: w, left: limit, unlimited: limit <= 0}
}

func (c *capWriter) write(p []byte) error {
	if !c.unlimited {
		if int64(len(p)) > c.left {
			p, c.truncated = p[:c.left], true
		}
		c.left -= int64(len(p))
	}
	if len(p) == 0 {
		return nil
	}
	_, err := c.w.Write(p)
	return err
}
