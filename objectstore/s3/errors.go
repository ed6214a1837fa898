package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"
)

// errClosed is returned by reads after Close.
var errClosed = errors.New("read after close")

// mapErr wraps err with the operation and key and the errdefs class it belongs to. It is the
// one place where minio-go's error type is inspected. A nil err stays nil.
func mapErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if class := classify(err); class != nil {
		return fmt.Errorf("s3 %s %q: %w: %w", op, key, class, err)
	}
	return fmt.Errorf("s3 %s %q: %w", op, key, err)
}

// classify returns the errdefs class of err, or nil when it has none (context errors keep
// their own identity).
func classify(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		return classifyResponse(resp)
	}
	if transient(err) {
		return errdefs.ErrUnavailable
	}
	return nil
}

func classifyResponse(resp minio.ErrorResponse) error {
	switch {
	case resp.Code == "NoSuchKey" || resp.Code == "NoSuchBucket" || resp.StatusCode == http.StatusNotFound:
		return errdefs.ErrNotFound
	case resp.Code == "InvalidRange" || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return errdefs.ErrInvalidArgument
	case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized:
		return errdefs.ErrPermissionDenied
	case resp.StatusCode == http.StatusConflict:
		return errdefs.ErrConflict
	case resp.StatusCode == http.StatusPreconditionFailed:
		return errdefs.ErrFailedPrecondition
	case retryableResponse(resp):
		return errdefs.ErrUnavailable
	case resp.StatusCode == http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	}
	return nil
}

// isCode reports whether err is an S3 error response with one of codes.
func isCode(err error, codes ...string) bool {
	var resp minio.ErrorResponse
	return errors.As(err, &resp) && slices.Contains(codes, resp.Code)
}

var retryableCodes = []string{"RequestTimeout", "RequestTimeTooSkewed", "SlowDown", "SlowDownRead",
	"SlowDownWrite", "InternalError", "ServiceUnavailable", "ExpiredToken", "RequestError"}

func retryableResponse(resp minio.ErrorResponse) bool {
	return resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests ||
		slices.Contains(retryableCodes, resp.Code)
}

// transient reports whether err is worth retrying: a server that is overloaded or briefly
// away, a connection that broke or timed out. Context errors are never transient.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		return retryableResponse(resp)
	}
	var nerr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return true
	case errors.As(err, &nerr):
		return true // dial, DNS and timeout failures
	}
	return false
}
