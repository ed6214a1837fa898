package initproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/containerd/errdefs"
)

// Client talks to one sandbox's init through its socket path. It holds no connection: every
// call dials (safely, see the package documentation), so a Client is cheap, safe for
// concurrent use and survives init restarts.
type Client struct {
	path string
	peer PeerCheck
}

// PeerCheck decides whether the process serving the socket is the sandbox's init. It gets
// the peer's credentials as the kernel recorded them when the server called listen(2)
// (SO_PEERCRED; the pid as seen from the host's pid namespace), and returns an error to refuse.
type PeerCheck func(pid int32, uid, gid uint32) error

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithPeerCheck makes every call check, before it sends anything, that the socket is served
// by the expected process: a sandbox process can replace the socket with its own listener
// (a relay that reads the next request, env and secrets included).
func WithPeerCheck(check PeerCheck) ClientOption { return func(c *Client) { c.peer = check } }

// New returns a client for the init socket at socketPath (a host path).
func New(socketPath string, opts ...ClientOption) *Client {
	c := &Client{path: socketPath}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Dial returns a client for the init socket at socketPath after checking, with one ping,
// that the socket is safe to use and the init speaks this protocol version.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	c := New(socketPath)
	resp, err := c.Ping(ctx)
	if err != nil {
		return nil, err
	}
	if resp.Protocol != Version {
		return nil, fmt.Errorf("init at %s speaks protocol %d, want %d: %w",
			socketPath, resp.Protocol, Version, errdefs.ErrFailedPrecondition)
	}
	return c, nil
}

// Path returns the socket path the client dials.
func (c *Client) Path() string { return c.path }

// Ping asks the init for its version, pid and uptime.
func (c *Client) Ping(ctx context.Context) (PingResponse, error) {
	var resp PingResponse
	if err := c.call(ctx, Request{Op: OpPing}, &resp); err != nil {
		return PingResponse{}, fmt.Errorf("ping init: %w", err)
	}
	return resp, nil
}

// Procs lists the execs the init started that are still running.
func (c *Client) Procs(ctx context.Context) ([]ProcInfo, error) {
	var resp ProcsResponse
	if err := c.call(ctx, Request{Op: OpProcs}, &resp); err != nil {
		return nil, fmt.Errorf("list init procs: %w", err)
	}
	return resp.Procs, nil
}

// Kill sends SIGKILL to the processes selected by req and waits until they are gone; with
// req.Signal it sends that signal once and does not wait.
func (c *Client) Kill(ctx context.Context, req KillRequest) (KillResponse, error) {
	if (req.Tag == "") == !req.All {
		return KillResponse{}, fmt.Errorf("kill: exactly one of tag or all: %w", errdefs.ErrInvalidArgument)
	}
	var resp KillResponse
	if err := c.call(ctx, Request{Op: OpKill, Kill: &req}, &resp); err != nil {
		return KillResponse{}, fmt.Errorf("kill in sandbox: %w", err)
	}
	return resp, nil
}

// Park makes the init close its listener once it answered (see UnparkSignal): until it is
// unparked nobody can connect to it, this client included.
func (c *Client) Park(ctx context.Context) error {
	var resp struct{}
	if err := c.call(ctx, Request{Op: OpPark}, &resp); err != nil {
		return fmt.Errorf("park init: %w", err)
	}
	return nil
}

// WaitReady pings every interval until the init answers or ctx ends.
func (c *Client) WaitReady(ctx context.Context, interval time.Duration) (PingResponse, error) {
	for {
		resp, err := c.Ping(ctx)
		if err == nil {
			return resp, nil
		}
		if errdefs.IsPermissionDenied(err) {
			return PingResponse{}, err
		}
		select {
		case <-ctx.Done():
			return PingResponse{}, fmt.Errorf("wait for init: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// open dials the init and arranges for the connection to close when ctx ends.
func (c *Client) open(ctx context.Context) (*net.UnixConn, func(), error) {
	conn, err := dialSocket(ctx, c.path)
	if err != nil {
		return nil, nil, err
	}
	if c.peer != nil {
		if err := checkPeer(conn, c.path, c.peer); err != nil {
			conn.Close()
			return nil, nil, err
		}
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	return conn, func() { stop(); conn.Close() }, nil
}

// call sends req and decodes the single result frame into resp.
func (c *Client) call(ctx context.Context, req Request, resp any) error {
	conn, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := sendRequest(conn, req); err != nil {
		return ctxErr(ctx, err)
	}
	var buf []byte
	t, payload, err := ReadFrame(bufio.NewReader(conn), &buf)
	if err != nil {
		return ctxErr(ctx, readError(err))
	}
	switch t {
	case FrameResult:
		return DecodeJSON(payload, resp)
	case FrameError:
		return decodeError(payload)
	}
	return fmt.Errorf("unexpected frame type %d: %w", t, ErrProtocol)
}

func sendRequest(w io.Writer, req Request) error {
	line, err := EncodeRequest(req)
	if err != nil {
		return err
	}
	if _, err := w.Write(line); err != nil {
		return fmt.Errorf("send request: %v: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// readError classifies a failed frame read: protocol violations stay as they are, a
// connection that ends early means the init went away.
func readError(err error) error {
	if errors.Is(err, ErrProtocol) {
		return err
	}
	return fmt.Errorf("init closed the connection early: %v: %w", err, errdefs.ErrUnavailable)
}

// ctxErr prefers the context's error when ctx ended (the connection was closed by us).
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}

// decodeError turns an error frame into an errdefs-classed error.
func decodeError(payload []byte) error {
	var e ErrorResponse
	if err := DecodeJSON(payload, &e); err != nil {
		return err
	}
	return fmt.Errorf("init: %s: %w", clip(e.Message), codeError(e.Code))
}

// maxMessage bounds strings from the sandbox that end up in host errors and logs.
const maxMessage = 4 << 10

// clip shortens a sandbox-provided message to maxMessage bytes.
func clip(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage] + "...(truncated)"
}

func codeError(code string) error {
	switch code {
	case CodeInvalidArgument:
		return errdefs.ErrInvalidArgument
	case CodeFailedPrecondition:
		return errdefs.ErrFailedPrecondition
	case CodeUnavailable:
		return errdefs.ErrUnavailable
	case CodeNotFound:
		return errdefs.ErrNotFound
	}
	return errdefs.ErrInternal
}
