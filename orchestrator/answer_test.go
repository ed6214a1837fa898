package orchestrator

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// flushRecorder calls onFlush when the handler flushes its answer.
type flushRecorder struct {
	*httptest.ResponseRecorder
	onFlush func()
}

func (f *flushRecorder) Flush() {
	f.onFlush()
	f.ResponseRecorder.Flush()
}

// TestBackgroundStartsAfterTheAnswer: a background step an API operation leaves (a
// rollback's spare copies) does not start before the answer is flushed, even when the
// operation lingers after leaving it; it starts once the answer is out.
func TestBackgroundStartsAfterTheAnswer(t *testing.T) {
	s := &session{}
	started := make(chan struct{})
	h := handle(func(r *http.Request) (any, error) {
		s.background(r.Context(), func(context.Context) { close(started) })
		select { // without the gate the step starts here
		case <-started:
		case <-time.After(200 * time.Millisecond):
		}
		return map[string]string{"rolled": "back"}, nil
	})
	var flushed, earlier bool
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	rec.onFlush = func() {
		flushed = true
		select {
		case <-started:
			earlier = true
		default:
		}
	}
	h(rec, httptest.NewRequest(http.MethodPost, "/v1/sandboxes/x/rollback", nil))
	if !flushed {
		t.Fatal("the answer was not flushed")
	}
	if earlier {
		t.Fatal("the background step started before the answer was flushed")
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the background step never started after the answer")
	}
	if got, want := rec.Header().Get("Content-Length"), strconv.Itoa(rec.Body.Len()); got != want {
		t.Fatalf("Content-Length %q, body of %s bytes", got, want)
	}
	s.bg.Wait()
}

// TestBackgroundStartsOnAFailedOperation: a failed operation's background steps start too.
func TestBackgroundStartsOnAFailedOperation(t *testing.T) {
	s := &session{}
	started := make(chan struct{})
	h := handle(func(r *http.Request) (any, error) {
		s.background(r.Context(), func(context.Context) { close(started) })
		return nil, context.DeadlineExceeded
	})
	rec := httptest.NewRecorder()
	h(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the background step of a failed operation never started")
	}
	s.bg.Wait()
}

// TestCloseOpensTheAnswerGate: a session closed within the request that left a background
// step (a release after a rollback) does not wait for the answer, which would never come.
func TestCloseOpensTheAnswerGate(t *testing.T) {
	s := &session{}
	ctx, answered := withAnswerGate(context.Background())
	defer answered()
	ran := false
	s.background(ctx, func(context.Context) { ran = true })
	done := make(chan error, 1)
	go func() { done <- s.close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("close waited for an answer that had not been given")
	}
	if !ran {
		t.Fatal("close returned before the background step ran")
	}
	if err := s.close(); err != nil { // twice: the gate closes once
		t.Fatal(err)
	}
}

// TestAnswerNotChunked: over a real server the answer carries its length (a flushed answer
// without one would be chunked and end only when the handler returns), and a value JSON
// cannot encode is an internal error, not a cut body.
func TestAnswerNotChunked(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok", handle(func(r *http.Request) (any, error) { return map[string]int{"n": 1}, nil }))
	mux.HandleFunc("GET /nan", handle(func(r *http.Request) (any, error) { return map[string]float64{"x": math.NaN()}, nil }))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/ok")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(resp.TransferEncoding) != 0 || resp.ContentLength != int64(len(body)) || string(body) != "{\"n\":1}\n" {
		t.Fatalf("answer %q: transfer encoding %v, length %d", body, resp.TransferEncoding, resp.ContentLength)
	}
	resp, err = http.Get(srv.URL + "/nan")
	if err != nil {
		t.Fatal(err)
	}
	var eb struct {
		Error struct{ Code, Message string }
	}
	err = json.NewDecoder(resp.Body).Decode(&eb)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusInternalServerError || eb.Error.Message == "" {
		t.Fatalf("unencodable answer: status %d, %+v, %v", resp.StatusCode, eb, err)
	}
}
