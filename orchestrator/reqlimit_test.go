package orchestrator

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// blockingAPI is a limiter in front of a handler that reads the body and then waits until
// released.
type blockingAPI struct {
	h       http.Handler
	entered chan struct{}
	release chan struct{}
}

func newBlockingAPI(perSandbox int, budget int64) *blockingAPI {
	b := &blockingAPI{entered: make(chan struct{}, 100), release: make(chan struct{})}
	b.h = newRequestLimiter(perSandbox, budget).wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			writeError(r.Context(), w, err)
			return
		}
		b.entered <- struct{}{}
		<-b.release
		writeJSON(w, http.StatusOK, map[string]string{})
	}))
	return b
}

func (b *blockingAPI) do(method, path string, body []byte) (int, api.Error) {
	rec := httptest.NewRecorder()
	b.h.ServeHTTP(rec, httptest.NewRequest(method, path, bytes.NewReader(body)))
	var eb api.ErrorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &eb)
	return rec.Code, eb.Error
}

// start runs n requests in the background and waits until all are inside the handler.
func (b *blockingAPI) start(t *testing.T, wg *sync.WaitGroup, n int, method, path string, body []byte) {
	t.Helper()
	for range n {
		wg.Go(func() { b.do(method, path, body) })
	}
	for range n {
		<-b.entered
	}
}

func wantExhausted(t *testing.T, code int, e api.Error, msg string) {
	t.Helper()
	if code != http.StatusTooManyRequests || e.Code != api.CodeResourceExhausted || !strings.Contains(e.Message, msg) {
		t.Fatalf("got %d %+v, want 429 resource_exhausted saying %q", code, e, msg)
	}
}

func TestPerSandboxRequestLimit(t *testing.T) {
	b := newBlockingAPI(2, 1<<30)
	var wg sync.WaitGroup
	b.start(t, &wg, 2, http.MethodGet, "/v1/sandboxes/sb-a/state", nil)
	code, e := b.do(http.MethodGet, "/v1/sandboxes/sb-a/diff", nil)
	wantExhausted(t, code, e, `sandbox "sb-a" has 2 API requests in flight`)
	b.start(t, &wg, 1, http.MethodGet, "/v1/sandboxes/sb-b/state", nil) // another sandbox is not held up
	close(b.release)
	wg.Wait()
	if code, _ := b.do(http.MethodGet, "/v1/sandboxes/sb-a/state", nil); code != http.StatusOK {
		t.Fatalf("after the others finished: %d", code)
	}
}

func TestRequestBodyBudget(t *testing.T) {
	b := newBlockingAPI(100, 3<<20)
	body := bytes.Repeat([]byte("x"), 2<<20)
	var wg sync.WaitGroup
	b.start(t, &wg, 1, http.MethodPost, "/v1/sandboxes/sb-a/state", body)
	code, e := b.do(http.MethodPost, "/v1/sandboxes/sb-b/state", body)
	wantExhausted(t, code, e, "over the limit of 3145728")
	// Streamed routes hold no body in memory: not charged.
	b.start(t, &wg, 1, http.MethodPut, "/v1/sandboxes/sb-b/files", body)
	close(b.release)
	wg.Wait()
	if code, _ := b.do(http.MethodPost, "/v1/sandboxes/sb-b/state", body); code != http.StatusOK {
		t.Fatalf("after the first finished: %d", code)
	}
}

func TestRequestBodyLimitPerRoute(t *testing.T) {
	b := newBlockingAPI(100, 1<<30)
	close(b.release)
	code, e := b.do(http.MethodPost, "/v1/sandboxes/sb-a/checkpoints", bytes.Repeat([]byte(" "), maxJSONBody+1))
	wantExhausted(t, code, e, "more than the limit of 1048576 for this route")
	code, e = b.do(http.MethodPost, "/v1/sandboxes/sb-a/state", bytes.Repeat([]byte(" "), maxStatePatchBody+1))
	wantExhausted(t, code, e, "more than the limit")
	if code, _ := b.do(http.MethodPost, "/v1/sandboxes/sb-a/state", bytes.Repeat([]byte(" "), 2<<20)); code != http.StatusOK {
		t.Fatalf("a 2 MiB state patch: %d", code)
	}
	// A body without a length is cut at the route's limit while it is read.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/pools", io.MultiReader(strings.NewReader(strings.Repeat(" ", maxJSONBody+10))))
	req.ContentLength = -1
	b.h.ServeHTTP(rec, req)
	if rec.Code == http.StatusOK {
		t.Fatal("an unsized body past the limit was read whole")
	}
}
