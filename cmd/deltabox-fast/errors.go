package main

import (
	"context"
	"io"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// Errors print as deltabox-cli prints them (cmd/deltabox/output.go, printError): the API
// code of the error's class, then its message without the class's own words at its end.
// The classes are api.Classes without their HTTP statuses (the api package links net/http);
// TestClassesMatchAPI keeps the two tables equal.

type class struct {
	code string
	is   func(error) bool
	err  error
}

var classes = []class{
	{"not_found", errdefs.IsNotFound, errdefs.ErrNotFound},
	{"invalid_argument", errdefs.IsInvalidArgument, errdefs.ErrInvalidArgument},
	{"conflict", errdefs.IsAlreadyExists, errdefs.ErrAlreadyExists},
	{"conflict", errdefs.IsConflict, errdefs.ErrConflict},
	{"not_modified", errdefs.IsNotModified, errdefs.ErrNotModified},
	{"failed_precondition", errdefs.IsFailedPrecondition, errdefs.ErrFailedPrecondition},
	{"permission_denied", errdefs.IsPermissionDenied, errdefs.ErrPermissionDenied},
	{"unauthenticated", errdefs.IsUnauthorized, errdefs.ErrUnauthenticated},
	{"resource_exhausted", errdefs.IsResourceExhausted, errdefs.ErrResourceExhausted},
	{"data_loss", errdefs.IsDataLoss, errdefs.ErrDataLoss},
	{"not_implemented", errdefs.IsNotImplemented, errdefs.ErrNotImplemented},
	{"aborted", errdefs.IsAborted, errdefs.ErrAborted},
	{"out_of_range", errdefs.IsOutOfRange, errdefs.ErrOutOfRange},
	{"unavailable", errdefs.IsUnavailable, errdefs.ErrUnavailable},
	{"canceled", errdefs.IsCanceled, context.Canceled},
	{"deadline_exceeded", errdefs.IsDeadlineExceeded, context.DeadlineExceeded},
	{"internal", errdefs.IsInternal, errdefs.ErrInternal},
	{"unknown", errdefs.IsUnknown, errdefs.ErrUnknown},
}

// classError is an error with a message and errdefs classes, as api.ToErrorStatus makes of
// the daemon's error bodies.
type classError struct {
	msg     string
	classes []error
}

func (e *classError) Error() string   { return e.msg }
func (e *classError) Unwrap() []error { return e.classes }

// apiError is api.ToErrorStatus: the classes of code, else of the HTTP status (status 0:
// unknown).
func apiError(code, msg string, status int) error {
	e := &classError{msg: msg}
	for _, c := range classes {
		if c.code == code {
			e.classes = append(e.classes, c.err)
		}
	}
	if len(e.classes) == 0 {
		e.classes = []error{statusClass(status)}
	}
	return e
}

// statusClass is errhttp.ToNative's mapping (a status it does not map is unknown).
func statusClass(status int) error {
	switch status {
	case 404:
		return errdefs.ErrNotFound
	case 400:
		return errdefs.ErrInvalidArgument
	case 409:
		return errdefs.ErrConflict
	case 412:
		return errdefs.ErrFailedPrecondition
	case 401:
		return errdefs.ErrUnauthenticated
	case 403:
		return errdefs.ErrPermissionDenied
	case 304:
		return errdefs.ErrNotModified
	case 429:
		return errdefs.ErrResourceExhausted
	case 500:
		return errdefs.ErrInternal
	case 501:
		return errdefs.ErrNotImplemented
	case 503:
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrUnknown
}

// errorCode is cmd/deltabox's errorCode over api.FromError (no local error of the front
// wraps ENOSPC, so the disk-full rule never applies).
func errorCode(err error) (code, msg string) {
	code = "internal"
	for _, c := range classes {
		if c.is(err) {
			code = c.code
			break
		}
	}
	msg = err.Error()
	for _, c := range classes {
		if s := strings.TrimSuffix(msg, ": "+c.err.Error()); c.is(err) && s != msg {
			msg = s
			break
		}
	}
	return code, msg
}

// printError reports err on stderr as deltabox-cli does in text output.
func printError(w io.Writer, err error) {
	code, msg := errorCode(err)
	if code == "internal" {
		io.WriteString(w, "deltabox: "+msg+"\n")
		return
	}
	io.WriteString(w, "deltabox: "+code+": "+msg+"\n")
}

// printJSONError is printError with -o json: the error document on one line (code, message
// without its class's words, and the exit code), as encoding/json writes errorDocument.
func printJSONError(w io.Writer, err error, exit int) {
	code, msg := errorCode(err)
	b := appendJSONString([]byte(`{"error":{"code":`), code)
	b = appendJSONString(append(b, `,"message":`...), msg)
	b = strconv.AppendInt(append(b, `,"exit":`...), int64(exit), 10)
	w.Write(append(b, "}}\n"...))
}
