package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errhttp"
)

// everyClass is every errdefs class with the code it must travel as.
var everyClass = []struct {
	err  error
	code string
}{
	{errdefs.ErrNotFound, CodeNotFound},
	{errdefs.ErrInvalidArgument, CodeInvalidArgument},
	{errdefs.ErrAlreadyExists, CodeConflict},
	{errdefs.ErrConflict, CodeConflict},
	{errdefs.ErrNotModified, CodeNotModified},
	{errdefs.ErrFailedPrecondition, CodeFailedPrecondition},
	{errdefs.ErrUnavailable, CodeUnavailable},
	{errdefs.ErrPermissionDenied, CodePermissionDenied},
	{errdefs.ErrUnauthenticated, CodeUnauthenticated},
	{errdefs.ErrResourceExhausted, CodeResourceExhausted},
	{errdefs.ErrDataLoss, CodeDataLoss},
	{errdefs.ErrNotImplemented, CodeNotImplemented},
	{context.Canceled, CodeCanceled},
	{context.DeadlineExceeded, CodeDeadlineExceeded},
	{errdefs.ErrAborted, CodeAborted},
	{errdefs.ErrOutOfRange, CodeOutOfRange},
	{errdefs.ErrInternal, CodeInternal},
	{errdefs.ErrUnknown, CodeUnknown},
}

func TestErrorRoundTrip(t *testing.T) {
	for _, c := range everyClass {
		wrapped := fmt.Errorf("sandbox %q: %w", "sb1", c.err)
		code, status := FromError(wrapped)
		if code != c.code {
			t.Errorf("%v: code %s, want %s", c.err, code, c.code)
		}
		back := ToError(Error{Code: code, Message: wrapped.Error()})
		if back.Error() != wrapped.Error() {
			t.Errorf("message changed: %q -> %q", wrapped, back)
		}
		if !errors.Is(back, c.err) {
			t.Errorf("%s came back as %v, not of class %T", code, back, c.err)
		}
		if again, st := FromError(back); again != code || st != status {
			t.Errorf("round trip of %s/%d gave %s/%d", code, status, again, st)
		}
	}
	if code, _ := FromError(errors.New("boom")); code != CodeInternal {
		t.Errorf("an unclassified error is %s, want internal", code)
	}
}

// TestErrorStatusesAreContainerds checks the statuses against containerd's own HTTP mapping
// for every class it maps (not_modified excepted: a 304 carries no body).
func TestErrorStatusesAreContainerds(t *testing.T) {
	for _, c := range everyClass {
		want := errhttp.ToHTTP(c.err)
		if c.err == errdefs.ErrNotModified || want == http.StatusInternalServerError {
			continue // errhttp has no status of its own for this class
		}
		if _, status := FromError(c.err); status != want {
			t.Errorf("%s: status %d, errhttp says %d", c.code, status, want)
		}
	}
}

func TestUnknownCodeTakesTheStatusClass(t *testing.T) {
	err := ToErrorStatus(Error{Code: "quota_gone", Message: "m"}, http.StatusTooManyRequests)
	if !errdefs.IsResourceExhausted(err) {
		t.Errorf("unknown code with 429 gave %v, want resource exhausted", err)
	}
	if err := ToError(Error{Code: "quota_gone", Message: "m"}); !errdefs.IsUnknown(err) {
		t.Errorf("unknown code in a stream gave %v, want unknown", err)
	}
}

// TestDiskFullIsResourceExhausted: a write that failed on a full disk travels as
// resource_exhausted unless a more specific class wraps it.
func TestDiskFullIsResourceExhausted(t *testing.T) {
	full := fmt.Errorf("write pack: %w", &os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC})
	for _, c := range []struct {
		err  error
		code string
	}{
		{full, CodeResourceExhausted},
		{fmt.Errorf("quota: %w", syscall.EDQUOT), CodeResourceExhausted},
		{fmt.Errorf("%w: %w", errdefs.ErrInternal, full), CodeResourceExhausted},
		{fmt.Errorf("pending rollback: %v: %w", full, errdefs.ErrFailedPrecondition), CodeFailedPrecondition},
		{fmt.Errorf("%w: %w", errdefs.ErrUnavailable, full), CodeUnavailable},
		{errors.New("other"), CodeInternal},
	} {
		if code, _ := FromError(c.err); code != c.code {
			t.Errorf("FromError(%v) = %s, want %s", c.err, code, c.code)
		}
	}
}
