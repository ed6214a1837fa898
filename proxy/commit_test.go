package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// faultUpstream misbehaves in one way and records the Idempotency-Key of every request that
// reached it; applied counts the requests it acted on (once per key if it honours keys).
type faultUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	mode    string // "hang", "reset" (after applying), "5xx" or "ok"
	honour  bool   // a repeated key is answered 200 without applying again
	keys    []string
	done    map[string]bool
	applied int
	release chan struct{}
}

func newFaultUpstream(t *testing.T, mode string, honour bool) *faultUpstream {
	u := &faultUpstream{mode: mode, honour: honour, release: make(chan struct{}), done: map[string]bool{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() { close(u.release); u.Close() })
	return u
}

func (u *faultUpstream) set(mode string) {
	u.mu.Lock()
	u.mode = mode
	u.mu.Unlock()
}

func (u *faultUpstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	seenKey := u.done[key] // applied under this key before
	u.keys = append(u.keys, key)
	mode := u.mode
	if mode != "5xx" && mode != "hang" && !(u.honour && seenKey) {
		u.applied++
		u.done[key] = true
	}
	u.mu.Unlock()
	switch {
	case mode == "hang":
		<-u.release
	case mode == "5xx":
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	case mode == "reset" && !(u.honour && seenKey):
		c, _, _ := http.NewResponseController(w).Hijack()
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close() // RST after the effect was applied
	default:
		_, _ = io.WriteString(w, "ok")
	}
}

func (u *faultUpstream) seenKeys() ([]string, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.keys...), u.applied
}

var keyFormat = regexp.MustCompile(`^deltabox-eff-[0-9a-f]{24}$`)

// assertOneKey checks the wire format of the key literally and that every attempt used it.
func assertOneKey(t *testing.T, keys []string, effectID string, want int) {
	t.Helper()
	if len(keys) != want {
		t.Fatalf("upstream got %d attempts, want %d", len(keys), want)
	}
	for _, k := range keys {
		if k != "deltabox-"+effectID || !keyFormat.MatchString(k) {
			t.Fatalf("Idempotency-Key %q, want deltabox-%s on every attempt", k, effectID)
		}
	}
}

func faultEnv(t *testing.T, u *faultUpstream) (*testEnv, string) {
	e := newEnv(t, WithCommitRetry(3, 10*time.Millisecond), WithCommitTimeout(150*time.Millisecond))
	e.register(2, "sb-a", "version: 1\nrules:\n  - {host: 127.0.0.1, action: hold}\n")
	return e, holdPOST(t, e.client(2), u.URL+"/charge", "pay")
}

func assertFailedCommit(t *testing.T, e *testEnv, id string, wantInHistory string) Effect {
	t.Helper()
	start := time.Now()
	res, err := e.p.Commit(e.ctx, "sb-a")
	if err != nil || res.Failed != 1 || res.Released != 0 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("commit took %s: attempts or timeouts are not bounded", d)
	}
	ferr := res.FailedError()
	if !errdefs.IsFailedPrecondition(ferr) || !strings.Contains(ferr.Error(), id) {
		t.Fatalf("FailedError %v does not name %s", ferr, id)
	}
	eff, _ := e.p.Effect("sb-a", id)
	if eff.Status != StatusFailed || eff.Attempts != 3 || len(eff.History) != 3 || eff.Error == "" {
		t.Fatalf("effect %+v", eff)
	}
	for _, a := range eff.History {
		if a.Time.IsZero() || !strings.Contains(a.Error, wantInHistory) {
			t.Fatalf("attempt %+v does not record %q", a, wantInHistory)
		}
	}
	return eff
}

func TestCommitHungUpstreamIsBounded(t *testing.T) {
	u := newFaultUpstream(t, "hang", true)
	e, id := faultEnv(t, u)
	assertFailedCommit(t, e, id, "no answer within 150ms")
	keys, _ := u.seenKeys()
	assertOneKey(t, keys, id, 3)
	u.set("ok")
	res, err := e.p.Retry(e.ctx, "sb-a", id)
	if err != nil || res.Released != 1 || res.FailedError() != nil {
		t.Fatalf("retry: %+v %v", res, err)
	}
	keys, _ = u.seenKeys()
	assertOneKey(t, keys, id, 4)
	if eff, _ := e.p.Effect("sb-a", id); eff.Status != StatusReleased || eff.Attempts != 4 || eff.History[3].Status != 200 {
		t.Fatalf("after retry: %+v", eff)
	}
}

func TestCommit5xxIsRecordedAndRetried(t *testing.T) {
	u := newFaultUpstream(t, "5xx", true)
	e, id := faultEnv(t, u)
	eff := assertFailedCommit(t, e, id, "upstream answered 503")
	if eff.ResponseStatus != 503 || eff.History[0].Status != 503 {
		t.Fatalf("status not recorded: %+v", eff)
	}
	// Failed is final until the operator decides: another commit does not send it.
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || len(res.Effects) != 0 {
		t.Fatalf("second commit: %+v %v", res, err)
	}
	u.set("ok")
	if res, err := e.p.Retry(e.ctx, "sb-a"); err != nil || res.Released != 1 { // every failed one
		t.Fatalf("retry: %+v %v", res, err)
	}
	keys, applied := u.seenKeys()
	assertOneKey(t, keys, id, 4)
	if applied != 1 {
		t.Fatalf("applied %d times", applied)
	}
	if _, err := e.p.Retry(e.ctx, "sb-a", id); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("retry of a released effect: %v", err)
	}
}

func TestCommitResetAfterApplying(t *testing.T) {
	t.Run("an upstream honouring the key applies it once", func(t *testing.T) {
		u := newFaultUpstream(t, "reset", true)
		e, id := faultEnv(t, u)
		res, err := e.p.Commit(e.ctx, "sb-a")
		if err != nil || res.Released != 1 {
			t.Fatalf("commit: %+v %v", res, err)
		}
		keys, applied := u.seenKeys()
		assertOneKey(t, keys, id, 2)
		eff, _ := e.p.Effect("sb-a", id)
		if applied != 1 || eff.Attempts != 2 || eff.History[0].Error == "" || eff.History[1].Status != 200 {
			t.Fatalf("applied %d times, effect %+v", applied, eff)
		}
	})
	t.Run("an upstream ignoring the key applies it per attempt, all with one key", func(t *testing.T) {
		u := newFaultUpstream(t, "reset", false)
		e, id := faultEnv(t, u)
		assertFailedCommit(t, e, id, "")
		keys, applied := u.seenKeys()
		assertOneKey(t, keys, id, 3)
		if applied != 3 {
			t.Fatalf("applied %d times", applied)
		}
		abandoned, err := e.p.Abandon(e.ctx, "sb-a", id)
		if err != nil || abandoned.Status != StatusAbandoned {
			t.Fatalf("abandon: %+v %v", abandoned, err)
		}
		if _, err := e.p.Retry(e.ctx, "sb-a", id); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("retry of an abandoned effect: %v", err)
		}
		e.close()
		if eff, _ := newEnvAt(t, e.dir).p.Effect("sb-a", id); eff.Status != StatusAbandoned || len(eff.History) != 3 {
			t.Fatalf("after restart: %+v", eff)
		}
	})
}

func TestRetryAndAbandonRefuseWhatNoCommitTook(t *testing.T) {
	u := newFaultUpstream(t, "ok", true)
	e, id := faultEnv(t, u)
	if _, err := e.p.Retry(e.ctx, "sb-a", id); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("retry of a held effect: %v", err)
	}
	if _, err := e.p.Abandon(e.ctx, "sb-a", id); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("abandon of a held effect: %v", err)
	}
	if _, err := e.p.Retry(e.ctx, "sb-a", "eff-nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("retry of an unknown effect: %v", err)
	}
	if keys, _ := u.seenKeys(); len(keys) != 0 {
		t.Fatal("a held effect was sent without a commit")
	}
}

func TestNextAttemptIsShownWhileWaiting(t *testing.T) {
	u := newFaultUpstream(t, "5xx", true)
	e := newEnv(t, WithCommitRetry(2, 300*time.Millisecond))
	e.register(2, "sb-a", "version: 1\nrules:\n  - {host: 127.0.0.1, action: hold}\n")
	id := holdPOST(t, e.client(2), u.URL+"/x", "x")
	done := make(chan error)
	go func() { _, err := e.p.Commit(e.ctx, "sb-a"); done <- err }()
	deadline := time.Now().Add(2 * time.Second)
	for {
		eff, _ := e.p.Effect("sb-a", id)
		if eff.NextAttempt != nil {
			if eff.Status != StatusSending || eff.Attempts != 1 || eff.NextAttempt.Before(eff.History[0].Time) {
				t.Fatalf("progress %+v", eff)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("next attempt never shown")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if eff, _ := e.p.Effect("sb-a", id); eff.NextAttempt != nil {
		t.Fatalf("next attempt still shown after the commit: %+v", eff)
	}
}

// TestCommitDoesNotHoldTheSandbox: while a commit (or a resumed one) waits on a hung
// upstream, the sandbox holds new effects and rolls them back without waiting for it, and a
// rollback never drops what the commit took.
func TestCommitDoesNotHoldTheSandbox(t *testing.T) {
	u := newFaultUpstream(t, "hang", true)
	e := newEnv(t, WithCommitRetry(1, time.Millisecond), WithCommitTimeout(5*time.Second))
	e.register(2, "sb-a", "version: 1\nrules:\n  - {host: 127.0.0.1, action: hold}\n")
	c := e.client(2)
	first := holdPOST(t, c, u.URL+"/first", "1")
	done := make(chan error, 1)
	go func() { _, err := e.p.Commit(e.ctx, "sb-a"); done <- err }()
	waitFor(t, "the commit to send", func() bool { keys, _ := u.seenKeys(); return len(keys) == 1 })
	wm := e.p.Watermark("sb-a")
	later := holdPOST(t, c, u.URL+"/later", "2")
	resume := make(chan error, 1)
	go func() { resume <- e.p.ResumeCommits(e.ctx) }() // as at start, in the background
	start := time.Now()
	dropped, _, err := e.p.Rollback(e.ctx, "sb-a", wm)
	if err != nil || dropped != 1 || time.Since(start) > time.Second {
		t.Fatalf("rollback during a hung commit: %d dropped, %v, after %s", dropped, err, time.Since(start))
	}
	if eff, _ := e.p.Effect("sb-a", later); eff.Status != StatusDropped {
		t.Fatalf("later effect %+v", eff)
	}
	if dropped, _, _ := e.p.Rollback(e.ctx, "sb-a", 0); dropped != 0 { // forced past the commit
		t.Fatalf("a rollback dropped %d effects a commit had taken", dropped)
	}
	if eff, _ := e.p.Effect("sb-a", first); eff.Status != StatusSending {
		t.Fatalf("effect in flight %+v", eff)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-resume; err != nil {
		t.Fatal(err)
	}
	if eff, _ := e.p.Effect("sb-a", first); eff.Status != StatusFailed || !strings.Contains(eff.Error, "no answer within 5s") {
		t.Fatalf("after the timeout: %+v", eff)
	}
}

func TestRemoveSandboxCancelsAHungCommit(t *testing.T) {
	u := newFaultUpstream(t, "hang", true)
	e := newEnv(t, WithCommitRetry(5, time.Millisecond), WithCommitTimeout(time.Minute))
	e.register(2, "sb-a", "version: 1\nrules:\n  - {host: 127.0.0.1, action: hold}\n")
	holdPOST(t, e.client(2), u.URL+"/x", "x")
	done := make(chan error, 1)
	go func() { _, err := e.p.Commit(e.ctx, "sb-a"); done <- err }()
	waitFor(t, "the commit to send", func() bool { keys, _ := u.seenKeys(); return len(keys) == 1 })
	start := time.Now()
	if err := e.p.RemoveSandbox("sb-a"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("release waited %s for a hung commit", took)
	}
	if err := <-done; err == nil {
		t.Fatal("the cancelled commit reported success")
	}
}
