package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/client"
)

// TestErrorClassesSurviveTheAPI sends every errdefs class through the daemon's error writer,
// a real HTTP server on a unix socket and the client, and checks the client gets the class
// back (and the daemon's message).
func TestErrorClassesSurviveTheAPI(t *testing.T) {
	classes := []error{
		errdefs.ErrNotFound, errdefs.ErrInvalidArgument, errdefs.ErrAlreadyExists, errdefs.ErrConflict,
		errdefs.ErrNotModified, errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrPermissionDenied,
		errdefs.ErrUnauthenticated, errdefs.ErrResourceExhausted, errdefs.ErrDataLoss, errdefs.ErrNotImplemented,
		context.Canceled, context.DeadlineExceeded, errdefs.ErrAborted, errdefs.ErrOutOfRange, errdefs.ErrInternal,
		errdefs.ErrUnknown,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", handle(func(r *http.Request) (any, error) {
		i, _ := strconv.Atoi(r.PathValue("id"))
		return nil, fmt.Errorf("sandbox %d: %w", i, classes[i])
	}))
	c := serveUnix(t, mux)
	for i, class := range classes {
		_, err := c.Sandbox(context.Background(), strconv.Itoa(i))
		if !errors.Is(err, class) {
			t.Errorf("%v came back as %v", class, err)
		}
		if want := fmt.Sprintf("sandbox %d: %v", i, class); err == nil || err.Error() != want {
			t.Errorf("message %q, want %q", err, want)
		}
	}
}

// serveUnix serves h on a unix socket for the test and returns a client of it.
func serveUnix(t *testing.T, h http.Handler) *client.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return client.New(sock)
}
