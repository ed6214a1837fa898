package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// maxRequestBody bounds every JSON request body the API reads.
const maxRequestBody = 32 << 20

// Handler returns the HTTP handler of the /v1 API, within the request limits (reqlimit.go).
func (o *Orchestrator) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", handle(func(r *http.Request) (any, error) { return o.Info(r.Context()) }))
	o.routes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(r.Context(), w, fmt.Errorf("no API route %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
	return o.limiter().wrap(mux)
}

// handle adapts a function returning a value or an error to an http.HandlerFunc writing JSON.
// The background steps fn leaves (session.background) start once the answer is written and
// flushed, or fn has failed.
func handle(fn func(r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, answered := withAnswerGate(r.Context())
		defer answered()
		v, err := fn(r.WithContext(ctx))
		if err != nil {
			writeError(r.Context(), w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
		if f, ok := w.(http.Flusher); ok {
			f.Flush() // the whole answer (its length is set): the client has it before answered
		}
	}
}

type answerGateKey struct{}

// withAnswerGate returns ctx with a gate that the background steps of an operation under it
// wait for (answerGate), and the function that opens it.
func withAnswerGate(ctx context.Context) (context.Context, func()) {
	ch := make(chan struct{})
	var once sync.Once
	return context.WithValue(ctx, answerGateKey{}, (<-chan struct{})(ch)), func() { once.Do(func() { close(ch) }) }
}

// answerGate returns the gate of withAnswerGate in ctx, or nil.
func answerGate(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(answerGateKey{}).(<-chan struct{})
	return ch
}

// decode reads a JSON request body into v, rejecting unknown fields and anything after the
// one JSON value: a check made on the decoded value then holds for the whole request (a
// second value or trailing bytes could otherwise mean one thing to a checker and another to
// the handler).
func decode(r *http.Request, v any) error {
	if err := decodeOne(http.MaxBytesReader(nil, r.Body, maxRequestBody), v); err != nil {
		return fmt.Errorf("decode request body: %w", err)
	}
	return nil
}

// decodeOne decodes exactly one JSON value from rd into v: unknown fields, a second value and
// trailing non-space bytes are invalid arguments.
func decodeOne(rd io.Reader, v any) error {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("data after the JSON value (send exactly one object): %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// writeJSON writes v with its length, so that a flush puts the whole answer on the wire
// (without it, net/http chunks a flushed body and ends it only when the handler returns).
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		code, st := api.FromError(fmt.Errorf("encode the answer: %v: %w", err, errdefs.ErrInternal))
		status = st
		body, _ = json.Marshal(api.ErrorBody{Error: api.Error{Code: code, Message: "encode the answer: " + err.Error()}}) // cannot fail
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(ctx context.Context, w http.ResponseWriter, err error) {
	code, status := api.FromError(err)
	if status >= 500 {
		log.L(ctx).Error("request failed", "code", code, "error", err)
	}
	writeJSON(w, status, api.ErrorBody{Error: api.Error{Code: code, Message: err.Error()}})
}

// Listen opens the API's unix socket at path with mode 0600, or 0660 owned by gid when
// gid >= 0. A stale socket is replaced; a socket another daemon still serves is a conflict.
func Listen(path string, gid int) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	mode := os.FileMode(0o600)
	if gid >= 0 {
		mode = 0o660
		if err := os.Chown(path, 0, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("chown socket %s to gid %d: %w", path, gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return l, nil
}

func removeStaleSocket(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("another daemon is serving %s: %w", path, errdefs.ErrAlreadyExists)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}
