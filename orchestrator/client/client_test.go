package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// blockingDaemon answers nothing until the request is given up; arrived is told when a
// request reaches it.
func blockingDaemon(t *testing.T) (c *Client, arrived chan struct{}) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	arrived = make(chan struct{}, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return New(sock), arrived
}

func TestCancelledRequestKeepsContextCanceled(t *testing.T) {
	c, arrived := blockingDaemon(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := c.Info(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request gave %v, want context.Canceled", err)
	}
	if errdefs.IsUnavailable(err) {
		t.Errorf("cancelled request reported as an unreachable daemon: %v", err)
	}
}

func TestCancelledBeforeSendKeepsContextCanceled(t *testing.T) {
	c, _ := blockingDaemon(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Info(ctx); !errors.Is(err, context.Canceled) || errdefs.IsUnavailable(err) {
		t.Fatalf("got %v, want context.Canceled and not unavailable", err)
	}
}

func TestDeadlineKeepsDeadlineExceeded(t *testing.T) {
	c, _ := blockingDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Info(ctx); !errors.Is(err, context.DeadlineExceeded) || errdefs.IsUnavailable(err) {
		t.Fatalf("got %v, want context.DeadlineExceeded and not unavailable", err)
	}
}

func TestCancelledExecStreamKeepsContextCanceled(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"o":"aGk="}` + "\n")) // output, then nothing until the client gives up
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	_, err = New(sock).Exec(ctx, "sb", api.ExecRequest{Argv: []string{"sleep", "9"}}, nil, discard{}, discard{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled exec gave %v, want context.Canceled", err)
	}
}

func TestNoDaemonIsUnavailable(t *testing.T) {
	c := New(filepath.Join(t.TempDir(), "none.sock"))
	if _, err := c.Info(context.Background()); !errdefs.IsUnavailable(err) {
		t.Fatalf("no daemon gave %v, want unavailable", err)
	}
}

func TestUndecodableErrorTakesTheStatusClass(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such thing", http.StatusNotFound) // a proxy's or an old daemon's plain text
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	if _, err := New(sock).Info(context.Background()); !errdefs.IsNotFound(err) {
		t.Fatalf("plain 404 gave %v, want not found", err)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestDialAddresses(t *testing.T) {
	if c, err := Dial("unix:///run/x.sock", Options{}); err != nil || c.Address() != "/run/x.sock" {
		t.Fatalf("unix:// address: %v %v", c, err)
	}
	for _, bad := range []struct{ addr, want string }{
		{"http://host:1", "want a unix socket path or tcp://host:port"},
		{"tcp://host", "want tcp://host:port"},
		{"tcp://host:1/path", "want tcp://host:port"},
		{"tcp://host:1", "needs a token"},
	} {
		_, err := Dial(bad.addr, Options{})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Dial(%q): %v", bad.addr, err)
		}
	}
	if _, err := Dial("tcp://host:1", Options{Token: "t", CAFile: "/no/such/ca.pem"}); err == nil {
		t.Error("a missing CA file was accepted")
	}
	c := Failed("tcp://host:1", errdefs.ErrInvalidArgument)
	if _, err := c.Info(context.Background()); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a Failed client answered %v", err)
	}
}
