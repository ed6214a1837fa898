package e2b

// The in-sandbox services (process.Process and filesystem.Filesystem) speak the Connect
// protocol with JSON bodies, which is all the e2b SDK sends (useBinaryFormat: false). They are
// served by hand here instead of with connectrpc.com/connect: connect-go needs generated
// protobuf message types, and the gateway's wire types are plain Go structs written for this
// package (see wire.go); the JSON side of Connect is small:
//
//   - unary: POST /pkg.Service/Method with Content-Type application/json; the answer is the
//     JSON message, or an error status with {"code": "...", "message": "..."};
//   - server streaming: the request body and every answer message are enveloped (1 flag byte,
//     4-byte big-endian length, JSON); the stream ends with a frame flagged 0x02 holding
//     {} or {"error": {...}}.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// maxMessage bounds one request message.
const maxMessage = 4 << 20

const endStreamFlag = 0x02

// rpcError is a Connect error: a code word and a message.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// connectCode maps an error to a Connect code and its HTTP status.
func connectCode(err error) (string, int) {
	switch {
	case errors.Is(err, errUnimplemented), errdefs.IsNotImplemented(err):
		return "unimplemented", http.StatusNotImplemented
	case errors.Is(err, errUnauthenticated):
		return "unauthenticated", http.StatusUnauthorized
	case errdefs.IsNotFound(err):
		return "not_found", http.StatusNotFound
	case errdefs.IsInvalidArgument(err):
		return "invalid_argument", http.StatusBadRequest
	case errdefs.IsAlreadyExists(err):
		return "already_exists", http.StatusConflict
	case errdefs.IsConflict(err):
		return "aborted", http.StatusConflict
	case errdefs.IsFailedPrecondition(err):
		return "failed_precondition", http.StatusBadRequest
	case errdefs.IsPermissionDenied(err):
		return "permission_denied", http.StatusForbidden
	case errdefs.IsUnavailable(err):
		return "unavailable", http.StatusServiceUnavailable
	case errdefs.IsResourceExhausted(err):
		return "resource_exhausted", http.StatusTooManyRequests
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded", http.StatusGatewayTimeout
	case errors.Is(err, context.Canceled):
		return "canceled", 499
	}
	return "internal", http.StatusInternalServerError
}

var (
	errUnimplemented   = errors.New("unimplemented")
	errUnauthenticated = errors.New("unauthenticated")
)

// writeUnaryError answers a unary call with a Connect error.
func writeUnaryError(w http.ResponseWriter, err error) {
	code, status := connectCode(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(rpcError{Code: code, Message: err.Error()})
}

// unary adapts a typed handler to a Connect unary endpoint.
func unary[Req, Resp any](fn func(ctx context.Context, sb *sandbox, req *Req) (*Resp, error), g *Gateway) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb, err := g.envdSandbox(r)
		if err != nil {
			writeUnaryError(w, err)
			return
		}
		var req Req
		if err := json.NewDecoder(io.LimitReader(r.Body, maxMessage)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			writeUnaryError(w, fmt.Errorf("decode request: %v: %w", err, errdefs.ErrInvalidArgument))
			return
		}
		ctx, cancel := rpcContext(r)
		defer cancel()
		resp, err := fn(ctx, sb, &req)
		if err != nil {
			writeUnaryError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// rpcContext honours the Connect-Timeout-Ms header and carries the user named by
// Authorization: Basic base64("user:").
func rpcContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx := r.Context()
	if u, _, ok := r.BasicAuth(); ok && u != "" {
		ctx = context.WithValue(ctx, userKey{}, u)
	}
	if ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		return context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
	}
	return context.WithCancel(ctx)
}

// stream writes the messages of a server-streaming answer.
type stream struct {
	mu sync.Mutex
	w  io.Writer
	rc *http.ResponseController
}

// send writes one enveloped message and flushes it.
func (s *stream) send(v any) error {
	return s.frame(0, v)
}

func (s *stream) frame(flags byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var hdr [5]byte
	hdr[0] = flags
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(data)))
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(data); err != nil {
		return err
	}
	return s.rc.Flush()
}

// end closes the stream, with err when not nil.
func (s *stream) end(err error) {
	var body struct {
		Error *rpcError `json:"error,omitempty"`
	}
	if err != nil {
		code, _ := connectCode(err)
		body.Error = &rpcError{Code: code, Message: err.Error()}
	}
	_ = s.frame(endStreamFlag, body)
}

// serverStream adapts a typed streaming handler to a Connect server-streaming endpoint. The
// handler sends messages on the stream and returns the error (if any) that ends it.
func serverStream[Req any](fn func(ctx context.Context, sb *sandbox, req *Req, s *stream, keepalive time.Duration) error, g *Gateway) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		sb, err := g.envdSandbox(r)
		var req Req
		if err == nil {
			err = readEnvelope(r.Body, &req)
		}
		s := &stream{w: w, rc: http.NewResponseController(w)}
		if err != nil {
			s.end(err)
			return
		}
		ctx, cancel := rpcContext(r)
		defer cancel()
		ka := 30 * time.Second
		if sec, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && sec > 0 {
			ka = time.Duration(sec) * time.Second
		}
		s.end(fn(ctx, sb, &req, s, ka))
	}
}

// readEnvelope reads the one enveloped request message of a server-streaming call.
func readEnvelope(body io.Reader, v any) error {
	br := bufio.NewReader(body)
	var hdr [5]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return fmt.Errorf("read request envelope: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if hdr[0]&0x01 != 0 {
		return fmt.Errorf("compressed request messages are not supported: %w", errUnimplemented)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxMessage {
		return fmt.Errorf("request message of %d bytes is over %d: %w", n, maxMessage, errdefs.ErrInvalidArgument)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(br, data); err != nil {
		return fmt.Errorf("read request message: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode request message: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// pbTime formats t as a protobuf JSON Timestamp (RFC 3339, UTC, "Z").
func pbTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000000Z") }
