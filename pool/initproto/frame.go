package initproto

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/containerd/errdefs"
)

// FrameType is the first byte of a frame.
type FrameType byte

// The frame types; see the package documentation for who sends which.
const (
	FrameStdin    FrameType = 1 // client -> server: stdin bytes
	FrameStdinEOF FrameType = 2 // client -> server: close stdin
	FrameStdout   FrameType = 3 // server -> client: stdout bytes
	FrameStderr   FrameType = 4 // server -> client: stderr bytes
	FrameExit     FrameType = 5 // server -> client: ExitStatus JSON, last frame of an exec
	FrameResult   FrameType = 6 // server -> client: result JSON of ping/procs/kill
	FrameError    FrameType = 7 // server -> client: ErrorResponse JSON
	FrameResize   FrameType = 8 // client -> server (OpExecTTY): new window size, EncodeResize
	FrameStarted  FrameType = 9 // server -> client: Started JSON (exec with ReportStart)
)

const headerSize = 5

// ErrProtocol marks a peer that broke the protocol (oversized or unknown frames, bad JSON).
var ErrProtocol = fmt.Errorf("init protocol violation: %w", errdefs.ErrDataLoss)

// maxPayload returns the largest payload allowed for t, or -1 for an unknown type.
func maxPayload(t FrameType) int {
	switch t {
	case FrameStdin, FrameStdout, FrameStderr:
		return MaxDataFrame
	case FrameStdinEOF:
		return 0
	case FrameResize:
		return resizeSize
	case FrameExit, FrameResult, FrameError, FrameStarted:
		return MaxJSONFrame
	}
	return -1
}

// WriteFrame writes one frame with a single Write call.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > maxPayload(t) {
		return fmt.Errorf("frame type %d: payload of %d bytes over the limit: %w", t, len(payload), ErrProtocol)
	}
	buf := make([]byte, headerSize+len(payload))
	buf[0] = byte(t)
	binary.BigEndian.PutUint32(buf[1:headerSize], uint32(len(payload)))
	copy(buf[headerSize:], payload)
	_, err := w.Write(buf)
	return err
}

// WriteJSONFrame marshals v and writes it as one frame of type t.
func WriteJSONFrame(w io.Writer, t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	return WriteFrame(w, t, b)
}

// ReadFrame reads one frame from r. The payload is read into buf when it fits (buf is
// grown otherwise), so it is only valid until the next call with the same buf. Unknown
// types and payloads over the type's limit fail with ErrProtocol before anything more is
// read. A clean end of stream before the header returns io.EOF.
func ReadFrame(r io.Reader, buf *[]byte) (FrameType, []byte, error) {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, fmt.Errorf("truncated frame header: %w", ErrProtocol)
		}
		return 0, nil, err
	}
	t := FrameType(hdr[0])
	n := binary.BigEndian.Uint32(hdr[1:])
	limit := maxPayload(t)
	if limit < 0 {
		return 0, nil, fmt.Errorf("unknown frame type %d: %w", t, ErrProtocol)
	}
	if uint64(n) > uint64(limit) {
		return 0, nil, fmt.Errorf("frame type %d: payload of %d bytes over the limit of %d: %w", t, n, limit, ErrProtocol)
	}
	if cap(*buf) < int(n) {
		*buf = make([]byte, n)
	}
	p := (*buf)[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, fmt.Errorf("frame type %d: truncated payload: %w", t, ErrProtocol)
	}
	return t, p, nil
}

// DecodeJSON unmarshals a JSON frame payload, mapping failures to ErrProtocol.
func DecodeJSON(payload []byte, v any) error {
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("decode frame: %v: %w", err, ErrProtocol)
	}
	return nil
}

// EncodeRequest returns req as a request line (JSON plus '\n'), setting its Version.
func EncodeRequest(req Request) ([]byte, error) {
	req.Version = Version
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	if len(b)+1 > MaxRequestSize {
		return nil, fmt.Errorf("request of %d bytes over the limit of %d: %w", len(b)+1, MaxRequestSize, errdefs.ErrInvalidArgument)
	}
	return append(b, '\n'), nil
}

// ReadRequest reads one request line from r, at most MaxRequestSize bytes. It does not
// check the version (the server answers a mismatch with an error frame) and ignores
// unknown fields, so optional fields can be added without a version bump: an init from an
// older build may serve a newer daemon after an upgrade.
func ReadRequest(r *bufio.Reader) (Request, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxRequestSize {
			return Request{}, fmt.Errorf("request line over %d bytes: %w", MaxRequestSize, ErrProtocol)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return Request{}, fmt.Errorf("read request: %w", err)
		}
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		return Request{}, fmt.Errorf("decode request: %v: %w", err, ErrProtocol)
	}
	return req, nil
}

// FrameWriter serializes frames from several goroutines onto one stream. After Close, writes
// are dropped silently (the exec's output pumps may outlive the response).
type FrameWriter struct {
	mu     sync.Mutex
	w      io.Writer
	err    error
	closed bool
}

// NewFrameWriter returns a FrameWriter writing to w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// Write writes one frame; after the first write error every call returns that error.
func (fw *FrameWriter) Write(t FrameType, payload []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.closed {
		return nil
	}
	if fw.err == nil {
		fw.err = WriteFrame(fw.w, t, payload)
	}
	return fw.err
}

// WriteJSON writes one JSON frame (not the last one).
func (fw *FrameWriter) WriteJSON(t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	return fw.Write(t, b)
}

// Final writes a last JSON frame and closes the writer for everyone else.
func (fw *FrameWriter) Final(t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.closed {
		return nil
	}
	fw.closed = true
	if fw.err != nil {
		return fw.err
	}
	return WriteFrame(fw.w, t, b)
}
