package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// fakeDaemon serves h on a unix socket and counts the connections that were closed.
func fakeDaemon(t *testing.T, h http.HandlerFunc) (sock string, closed *atomic.Int32) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	closed = new(atomic.Int32)
	srv := &http.Server{Handler: h, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock, closed
}

func oneShotClient(t *testing.T, sock string) *Client {
	t.Helper()
	c, err := Dial(sock, Options{OneShot: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.http.Transport.(oneShot); !ok {
		t.Fatalf("Dial with OneShot gave transport %T", c.http.Transport)
	}
	return c
}

// A one-shot request gets its answer and its error classes as the pooled transport does,
// and leaves no connection open.
func TestOneShotRequests(t *testing.T) {
	sock, closed := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		var req api.LeaseRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.URL.Path != "/v1/pools/p/lease" {
			http.Error(w, `{"error":{"code":"not_found","message":"pool \"q\" not found"}}`, http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(api.Lease{LeaseResult: api.LeaseResult{Sandbox: api.Sandbox{ID: "sb-1", Pool: "p", Env: req.Env}}})
	})
	c := oneShotClient(t, sock)
	l, err := c.Lease(context.Background(), "p", api.LeaseRequest{Env: []string{"A=1"}})
	if err != nil || l.ID != "sb-1" || len(l.Env) != 1 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	if _, err := c.Lease(context.Background(), "q", api.LeaseRequest{}); !errdefs.IsNotFound(err) {
		t.Fatalf("lease from a missing pool: %v, want not found", err)
	}
	waitFor(t, func() bool { return closed.Load() == 2 }, "both connections closed")
	none := oneShotClient(t, filepath.Join(t.TempDir(), "none.sock"))
	if _, err := none.Info(context.Background()); !errdefs.IsUnavailable(err) {
		t.Fatalf("no daemon gave %v, want unavailable", err)
	}
}

// Exec with stdin streams both ways at once: the daemon answers each input line before
// the input ends.
func TestOneShotExecStreamsBothWays(t *testing.T) {
	sock, _ := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex() // as the daemon's exec does
		in := bufio.NewReader(r.Body)
		if _, err := in.ReadBytes('\n'); err != nil { // the request line
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		enc := json.NewEncoder(w)
		for {
			line, err := in.ReadBytes('\n')
			if len(line) > 0 {
				enc.Encode(api.ExecEvent{Stdout: bytes.ToUpper(line)})
				w.(http.Flusher).Flush()
			}
			if err != nil {
				break
			}
		}
		enc.Encode(api.ExecEvent{Exit: &api.ExitStatus{Code: 3}})
	})
	pr, pw := io.Pipe()
	out := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		st, err := oneShotClient(t, sock).Exec(context.Background(), "sb", api.ExecRequest{Argv: []string{"cat"}}, pr, out, discard{})
		if err == nil && st.Code != 3 {
			err = errors.New("exit code not passed on")
		}
		done <- err
	}()
	pw.Write([]byte("one\n"))
	waitFor(t, func() bool { return out.String() == "ONE\n" }, "the first line answered while stdin is open")
	pw.Write([]byte("two\n"))
	pw.Close()
	if err := <-done; err != nil || out.String() != "ONE\nTWO\n" {
		t.Fatalf("exec: %v, output %q", err, out.String())
	}
}

// Cancelling a one-shot request, before the answer or during its stream, keeps
// context.Canceled and is not "unavailable".
func TestOneShotCancel(t *testing.T) {
	started := make(chan struct{}, 2)
	sock, _ := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/exec") {
			w.Write([]byte(`{"o":"aGk="}` + "\n"))
			w.(http.Flusher).Flush()
		}
		started <- struct{}{}
		<-r.Context().Done()
	})
	c := oneShotClient(t, sock)
	for _, call := range []func(ctx context.Context) error{
		func(ctx context.Context) error { _, err := c.Info(ctx); return err },
		func(ctx context.Context) error {
			_, err := c.Exec(ctx, "sb", api.ExecRequest{Argv: []string{"sleep", "9"}}, nil, discard{}, discard{})
			return err
		},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-started
			cancel()
		}()
		if err := call(ctx); !errors.Is(err, context.Canceled) || errdefs.IsUnavailable(err) {
			t.Errorf("cancelled request gave %v, want context.Canceled and not unavailable", err)
		}
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
