package api

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/containerd/errdefs"
)

func TestErrorRoundTrip(t *testing.T) {
	cases := []struct {
		err    error
		code   string
		status int
	}{
		{errdefs.ErrNotFound, CodeNotFound, http.StatusNotFound},
		{errdefs.ErrInvalidArgument, CodeInvalidArgument, http.StatusBadRequest},
		{errdefs.ErrAlreadyExists, CodeConflict, http.StatusConflict},
		{errdefs.ErrConflict, CodeConflict, http.StatusConflict},
		{errdefs.ErrFailedPrecondition, CodeFailedPrecondition, http.StatusPreconditionFailed},
		{errdefs.ErrUnavailable, CodeUnavailable, http.StatusServiceUnavailable},
		{errors.New("boom"), CodeInternal, http.StatusInternalServerError},
	}
	for _, c := range cases {
		wrapped := fmt.Errorf("sandbox %q: %w", "sb1", c.err)
		code, status := FromError(wrapped)
		if code != c.code || status != c.status {
			t.Errorf("%v: got %s/%d, want %s/%d", c.err, code, status, c.code, c.status)
		}
		back := ToError(Error{Code: code, Message: wrapped.Error()})
		if back.Error() != wrapped.Error() {
			t.Errorf("message changed: %q -> %q", wrapped, back)
		}
		if again, _ := FromError(back); again != code {
			t.Errorf("round trip of %s gave %s", code, again)
		}
	}
}
