package api

import (
	"context"
	"errors"
	"net/http"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errhttp"
)

// Stable machine-readable error codes of the API, one per errdefs class (docs/api.md lists
// them with their HTTP statuses). Clients branch on these words, never on messages.
const (
	CodeNotFound           = "not_found"
	CodeInvalidArgument    = "invalid_argument"
	CodeConflict           = "conflict" // errdefs.ErrAlreadyExists and errdefs.ErrConflict
	CodeNotModified        = "not_modified"
	CodeFailedPrecondition = "failed_precondition"
	CodeUnavailable        = "unavailable"
	CodePermissionDenied   = "permission_denied"
	CodeUnauthenticated    = "unauthenticated"
	CodeResourceExhausted  = "resource_exhausted"
	CodeDataLoss           = "data_loss"
	CodeNotImplemented     = "not_implemented"
	CodeCanceled           = "canceled"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeAborted            = "aborted"
	CodeOutOfRange         = "out_of_range"
	CodeInternal           = "internal"
	CodeUnknown            = "unknown"
)

// StatusClientClosedRequest is the status of a request given up because it was cancelled
// (no standard status exists; 499 is the customary one).
const StatusClientClosedRequest = 499

// Error is the body of every failed API response: {"error": {"code": ..., "message": ...}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorBody wraps Error as it travels on the wire.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Class ties an error class to its code and HTTP status.
type Class struct {
	Code   string
	Status int
	Is     func(error) bool // errdefs.IsNotFound and friends: sentinels and interfaces alike
	Err    error            // the sentinel the client wraps
}

// Classes maps every errdefs class to its code and HTTP status, most specific first; the
// statuses are errhttp's (containerd's own HTTP mapping) where it has one, except that
// not_modified answers 409 because a 304 carries no body.
var Classes = []Class{
	{CodeNotFound, http.StatusNotFound, errdefs.IsNotFound, errdefs.ErrNotFound},
	{CodeInvalidArgument, http.StatusBadRequest, errdefs.IsInvalidArgument, errdefs.ErrInvalidArgument},
	{CodeConflict, http.StatusConflict, errdefs.IsAlreadyExists, errdefs.ErrAlreadyExists},
	{CodeConflict, http.StatusConflict, errdefs.IsConflict, errdefs.ErrConflict},
	{CodeNotModified, http.StatusConflict, errdefs.IsNotModified, errdefs.ErrNotModified},
	{CodeFailedPrecondition, http.StatusPreconditionFailed, errdefs.IsFailedPrecondition, errdefs.ErrFailedPrecondition},
	{CodePermissionDenied, http.StatusForbidden, errdefs.IsPermissionDenied, errdefs.ErrPermissionDenied},
	{CodeUnauthenticated, http.StatusUnauthorized, errdefs.IsUnauthorized, errdefs.ErrUnauthenticated},
	{CodeResourceExhausted, http.StatusTooManyRequests, errdefs.IsResourceExhausted, errdefs.ErrResourceExhausted},
	{CodeDataLoss, http.StatusInternalServerError, errdefs.IsDataLoss, errdefs.ErrDataLoss},
	{CodeNotImplemented, http.StatusNotImplemented, errdefs.IsNotImplemented, errdefs.ErrNotImplemented},
	{CodeAborted, http.StatusConflict, errdefs.IsAborted, errdefs.ErrAborted},
	{CodeOutOfRange, http.StatusBadRequest, errdefs.IsOutOfRange, errdefs.ErrOutOfRange},
	{CodeUnavailable, http.StatusServiceUnavailable, errdefs.IsUnavailable, errdefs.ErrUnavailable},
	{CodeCanceled, StatusClientClosedRequest, errdefs.IsCanceled, context.Canceled},
	{CodeDeadlineExceeded, http.StatusGatewayTimeout, errdefs.IsDeadlineExceeded, context.DeadlineExceeded},
	{CodeInternal, http.StatusInternalServerError, errdefs.IsInternal, errdefs.ErrInternal},
	{CodeUnknown, http.StatusInternalServerError, errdefs.IsUnknown, errdefs.ErrUnknown},
}

// FromError translates an internal error into its API code and HTTP status. A full disk
// (ENOSPC, EDQUOT) that carries no more specific class is "resource_exhausted"; anything else
// that carries no known class is "internal".
func FromError(err error) (code string, status int) {
	for _, c := range Classes {
		if !c.Is(err) {
			continue
		}
		if c.Code != CodeInternal && c.Code != CodeUnknown {
			return c.Code, c.Status
		}
		if !diskFull(err) {
			return c.Code, c.Status
		}
		break
	}
	if diskFull(err) {
		return CodeResourceExhausted, http.StatusTooManyRequests
	}
	return CodeInternal, http.StatusInternalServerError
}

func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// ToError turns an API error back into an error of the matching errdefs class, so clients
// can use errdefs.IsNotFound and friends (and errors.Is(err, context.Canceled)). Its text is
// the daemon's message, unchanged. A code this client does not know is errdefs.ErrUnknown.
func ToError(e Error) error { return ToErrorStatus(e, 0) }

// ToErrorStatus is ToError for an error that came with an HTTP status: a code this client
// does not know takes the class of the status (errhttp's mapping).
func ToErrorStatus(e Error, status int) error {
	re := &remoteError{msg: e.Message}
	for _, c := range Classes {
		if c.Code == e.Code {
			re.classes = append(re.classes, c.Err) // "conflict" is both AlreadyExists and Conflict
		}
	}
	switch {
	case len(re.classes) > 0:
	case status != 0:
		re.classes = []error{errhttp.ToNative(status)}
	default:
		re.classes = []error{errdefs.ErrUnknown}
	}
	return re
}

type remoteError struct {
	msg     string
	classes []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.classes }
