package api

import (
	"errors"
	"net/http"

	"github.com/containerd/errdefs"
)

// Stable machine-readable error codes of the API (DESIGN.md section 4).
const (
	CodeNotFound           = "not_found"
	CodeInvalidArgument    = "invalid_argument"
	CodeConflict           = "conflict"
	CodeFailedPrecondition = "failed_precondition"
	CodeUnavailable        = "unavailable"
	CodePermissionDenied   = "permission_denied"
	CodeInternal           = "internal"
)

// Error is the body of every failed API response: {"error": {"code": ..., "message": ...}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorBody wraps Error as it travels on the wire.
type ErrorBody struct {
	Error Error `json:"error"`
}

type codeClass struct {
	code   string
	status int
	class  error
}

// classes maps error classes to codes and HTTP statuses, most specific first.
var classes = []codeClass{
	{CodeNotFound, http.StatusNotFound, errdefs.ErrNotFound},
	{CodeInvalidArgument, http.StatusBadRequest, errdefs.ErrInvalidArgument},
	{CodeConflict, http.StatusConflict, errdefs.ErrAlreadyExists},
	{CodeConflict, http.StatusConflict, errdefs.ErrConflict},
	{CodeFailedPrecondition, http.StatusPreconditionFailed, errdefs.ErrFailedPrecondition},
	{CodeUnavailable, http.StatusServiceUnavailable, errdefs.ErrUnavailable},
	{CodePermissionDenied, http.StatusForbidden, errdefs.ErrPermissionDenied},
}

// FromError translates an internal error into its API code and HTTP status. Anything that
// carries no known class is "internal".
func FromError(err error) (code string, status int) {
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.code, c.status
		}
	}
	return CodeInternal, http.StatusInternalServerError
}

// ToError turns an API error back into an error of the matching errdefs class, so clients
// can use errdefs.IsNotFound and friends. Its text is the daemon's message, unchanged.
func ToError(e Error) error {
	re := &remoteError{msg: e.Message}
	for _, c := range classes {
		if c.code == e.Code {
			re.classes = append(re.classes, c.class) // "conflict" is both AlreadyExists and Conflict
		}
	}
	if len(re.classes) == 0 {
		re.classes = []error{errdefs.ErrInternal}
	}
	return re
}

type remoteError struct {
	msg     string
	classes []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.classes }
