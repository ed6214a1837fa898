package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// holdPOST sends a POST that the base policy holds and returns its effect ID.
func holdPOST(t *testing.T, c *http.Client, url, body string) string {
	t.Helper()
	resp, err := c.Post(url, "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw := mustStatus(t, resp, http.StatusAccepted)
	var got struct {
		Held     bool   `json:"held"`
		EffectID string `json:"effect_id"`
	}
	if err := json.Unmarshal([]byte(raw), &got); err != nil || !got.Held || got.EffectID == "" {
		t.Fatalf("held answer %q: %v", raw, err)
	}
	if h := resp.Header.Get(HeaderEffectID); h != got.EffectID {
		t.Fatalf("header effect id %q, body %q", h, got.EffectID)
	}
	return got.EffectID
}

func TestHoldThenCommitOnce(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	if err := e.p.SetCheckpoint(e.ctx, "sb-a", "ck-1"); err != nil {
		t.Fatal(err)
	}
	id1 := holdPOST(t, c, up.URL+"/orders/1", "one")
	id2 := holdPOST(t, c, up.URL+"/orders/2", "two")
	if n := len(up.seen()); n != 0 {
		t.Fatalf("upstream saw %d requests before commit", n)
	}
	held := e.p.Effects("sb-a", StatusHeld)
	if len(held) != 2 || held[0].ID != id1 || held[0].Checkpoint != "ck-1" || held[1].Seq != held[0].Seq+1 {
		t.Fatalf("held effects %+v", held)
	}
	res, err := e.p.Commit(e.ctx, "sb-a")
	if err != nil || res.Released != 2 || res.Failed != 0 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	got := up.seen()
	if len(got) != 2 || got[0].Path != "/orders/1" || got[1].Body != "two" || got[0].Key != "deltabox-"+id1 {
		t.Fatalf("upstream saw %+v", got)
	}
	eff, err := e.p.Effect("sb-a", id2)
	if err != nil || eff.Status != StatusReleased || eff.ResponseStatus != 200 || eff.Attempts != 1 {
		t.Fatalf("effect %+v %v", eff, err)
	}
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Released != 0 || len(up.seen()) != 2 {
		t.Fatalf("second commit resent: %+v %v", res, err)
	}
}

func TestCommitRetries5xx(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	id := holdPOST(t, e.client(2), up.URL+"/retry", "x")
	up.mu.Lock()
	up.fail5xx = 2
	up.mu.Unlock()
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Released != 1 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	eff, _ := e.p.Effect("sb-a", id)
	if eff.Attempts != 3 || eff.Status != StatusReleased || len(up.seen()) != 1 {
		t.Fatalf("effect %+v, upstream %+v", eff, up.seen())
	}
	up.mu.Lock()
	up.fail5xx = 100
	up.mu.Unlock()
	id = holdPOST(t, e.client(2), up.URL+"/never", "x")
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Failed != 1 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if eff, _ := e.p.Effect("sb-a", id); eff.Status != StatusFailed || eff.ResponseStatus != 503 || eff.Attempts != 4 {
		t.Fatalf("effect %+v", eff)
	}
}

func TestHoldThenRollbackDrops(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	keep := holdPOST(t, c, up.URL+"/keep", "k")
	wm := e.p.Watermark("sb-a")
	drop := holdPOST(t, c, up.URL+"/drop", "d")
	dropped, compensated, err := e.p.Rollback(e.ctx, "sb-a", wm)
	if err != nil || dropped != 1 || compensated != 0 {
		t.Fatalf("rollback: %d %d %v", dropped, compensated, err)
	}
	if eff, _ := e.p.Effect("sb-a", drop); eff.Status != StatusDropped {
		t.Fatalf("dropped effect %+v", eff)
	}
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Released != 1 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if got := up.seen(); len(got) != 1 || got[0].Path != "/keep" || got[0].Key != "deltabox-"+keep {
		t.Fatalf("upstream saw %+v", got)
	}
}

func TestHoldSyntheticResponse(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", `version: 1
rules:
  - host: 127.0.0.1
    action: hold
    response: {status: 201, body: '{"queued": true}', headers: {Content-Type: application/json, X-Test: yes}}
`)
	resp, err := e.client(2).Post(up.URL+"/q", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if body := mustStatus(t, resp, 201); body != `{"queued": true}` || resp.Header.Get("X-Test") != "yes" {
		t.Fatalf("answer %q %v", body, resp.Header)
	}
	if id := resp.Header.Get(HeaderEffectID); id == "" || len(e.p.Effects("sb-a", StatusHeld)) != 1 {
		t.Fatalf("effect id %q, effects %+v", id, e.p.Effects("sb-a"))
	}
}

func TestCompensateOnRollback(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	wm := e.p.Watermark("sb-a")
	for _, n := range []string{"1", "2"} {
		resp, err := c.Post(up.URL+"/charge/"+n, "application/json", strings.NewReader(`{"amount": `+n+`0}`))
		if err != nil {
			t.Fatal(err)
		}
		if body := mustStatus(t, resp, 200); !strings.Contains(body, "ch_"+n) {
			t.Fatalf("charge answer %q", body)
		}
	}
	if n := len(up.seen()); n != 2 {
		t.Fatalf("upstream saw %d charges", n)
	}
	dropped, compensated, err := e.p.Rollback(e.ctx, "sb-a", wm)
	if err != nil || dropped != 0 || compensated != 2 {
		t.Fatalf("rollback: %d %d %v", dropped, compensated, err)
	}
	got := up.seen()
	if len(got) != 4 || got[2].Path != "/refund/ch_2" || got[3].Path != "/refund/ch_1" || got[2].Body != `{"amount": 20}` {
		t.Fatalf("upstream saw %+v", got)
	}
	for _, eff := range e.p.Effects("sb-a") {
		if eff.Status != StatusCompensated {
			t.Fatalf("effect %+v", eff)
		}
	}
	if _, c2, _ := e.p.Rollback(e.ctx, "sb-a", wm); c2 != 0 || len(up.seen()) != 4 {
		t.Fatal("second rollback compensated again")
	}
}

func TestConcurrentSandboxesKeepOwnEffects(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	const sandboxes, each = 10, 10
	for i := 0; i < sandboxes; i++ {
		e.register(10+i, fmt.Sprintf("sb-%d", i), basePolicy(up.hostPort()))
	}
	var wg sync.WaitGroup
	errs := make(chan error, sandboxes*each)
	for i := 0; i < sandboxes; i++ {
		c := e.client(10 + i)
		for k := 0; k < each; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Post(fmt.Sprintf("%s/sb-%d/%d", up.URL, i, k), "text/plain", strings.NewReader("x"))
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != http.StatusAccepted {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e.close()
	e2 := newEnvAt(t, e.dir) // the journals as loaded from disk
	for i := 0; i < sandboxes; i++ {
		effs := e2.p.Effects(fmt.Sprintf("sb-%d", i))
		if len(effs) != each {
			t.Fatalf("sb-%d has %d effects", i, len(effs))
		}
		for k, eff := range effs {
			if !strings.Contains(eff.URL, fmt.Sprintf("/sb-%d/", i)) || eff.Seq != uint64(k+1) {
				t.Fatalf("sb-%d holds %+v", i, eff)
			}
		}
	}
	if len(up.seen()) != 0 {
		t.Fatal("held requests reached the upstream")
	}
}

func TestBodyOverLimit(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t, WithBodyLimit(1024))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	resp, err := c.Post(up.URL+"/big", "text/plain", strings.NewReader(strings.Repeat("x", 2048)))
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusRequestEntityTooLarge)
	// Unknown length (chunked) is cut at the limit too.
	resp, err = c.Post(up.URL+"/big", "text/plain", struct{ *strings.Reader }{strings.NewReader(strings.Repeat("y", 4096))})
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusRequestEntityTooLarge)
	holdPOST(t, c, up.URL+"/small", strings.Repeat("z", 1024))
	if effs := e.p.Effects("sb-a"); len(effs) != 1 || !strings.HasSuffix(effs[0].URL, "/small") {
		t.Fatalf("journal holds %+v", effs)
	}
}

func TestResumeCommitAfterCrash(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	ids := []string{holdPOST(t, c, up.URL+"/first", "1"), holdPOST(t, c, up.URL+"/slow", "2"), holdPOST(t, c, up.URL+"/third", "3")}
	up.mu.Lock()
	up.block, up.received = make(chan struct{}), make(chan string, 10)
	up.mu.Unlock()
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error)
	go func() { _, err := e.p.Commit(ctx, "sb-a"); done <- err }()
	<-up.received // /first
	<-up.received // /slow arrived upstream: crash before its answer is journaled
	cancel()
	if err := <-done; err == nil {
		t.Fatal("interrupted commit returned nil")
	}
	close(up.block)
	e.close()

	e2 := newEnvAt(t, e.dir)
	if eff, _ := e2.p.Effect("sb-a", ids[1]); eff.Status != StatusSending {
		t.Fatalf("interrupted effect %+v", eff)
	}
	if err := e2.p.ResumeCommits(e2.ctx); err != nil {
		t.Fatal(err)
	}
	got := up.seen()
	if len(got) != 3 || got[0].Path != "/first" || got[1].Path != "/slow" || got[2].Path != "/third" {
		t.Fatalf("upstream applied %+v", got)
	}
	up.mu.Lock()
	slowKeys := up.keys["deltabox-"+ids[1]]
	up.mu.Unlock()
	if slowKeys != 2 {
		t.Fatalf("interrupted effect sent %d times, want 2 (same key)", slowKeys)
	}
	for _, id := range ids {
		if eff, _ := e2.p.Effect("sb-a", id); eff.Status != StatusReleased {
			t.Fatalf("effect %+v", eff)
		}
	}
	if err := e2.p.ResumeCommits(e2.ctx); err != nil || len(up.seen()) != 3 {
		t.Fatalf("second resume: %v", err)
	}
}

func TestRemoveSandbox(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	holdPOST(t, e.client(2), up.URL+"/x", "1")
	if err := e.p.RemoveSandbox("sb-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "journal", "sb-a.journal")); !os.IsNotExist(err) {
		t.Fatalf("journal still there: %v", err)
	}
	if len(e.p.Effects("sb-a")) != 0 || e.p.Watermark("sb-a") != 0 {
		t.Fatal("effects survived RemoveSandbox")
	}
	if err := e.p.RemoveSandbox("../etc"); err == nil {
		t.Fatal("path-like sandbox ID accepted")
	}
}

func TestJournalLimit(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t, WithJournalLimit(4096))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	holdPOST(t, c, up.URL+"/a", strings.Repeat("a", 1500))
	resp, err := c.Post(up.URL+"/b", "text/plain", strings.NewReader(strings.Repeat("b", 3000)))
	if err != nil {
		t.Fatal(err)
	}
	mustStatus(t, resp, http.StatusInsufficientStorage)
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Released != 1 {
		t.Fatalf("commit on a full journal: %+v %v", res, err)
	}
}

// TestJournalCompaction: once sent and dropped effects' bodies make up most of a journal,
// commit rewrites it without them; every effect keeps its record and status (also across a
// restart), a held effect keeps its body, and new effects append to the compacted file.
func TestJournalCompaction(t *testing.T) {
	defer func(n int64) { compactMin = n }(compactMin)
	compactMin = 4 << 10
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	path := filepath.Join(e.dir, "journal", "sb-a.journal")
	for i := 0; i < 10; i++ {
		holdPOST(t, c, up.URL+fmt.Sprintf("/sent%d", i), strings.Repeat("s", 4000))
	}
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Released != 10 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	dropMark := e.p.Watermark("sb-a")
	holdPOST(t, c, up.URL+"/dropped", strings.Repeat("d", 4000))
	if _, _, err := e.p.Rollback(e.ctx, "sb-a", dropMark); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 6000 { // 11 records of method, URL and status; the bodies alone were 44,000
		t.Fatalf("journal is %d bytes after commit and rollback; want it compacted", st.Size())
	}
	before := e.p.Effects("sb-a")
	if len(before) != 11 || before[0].Status != StatusReleased || before[10].Status != StatusDropped {
		t.Fatalf("effects after compaction: %+v", before)
	}
	holdPOST(t, c, up.URL+"/later", "the body of a held effect")
	e.close()

	e2 := newEnvAt(t, e.dir)
	after := e2.p.Effects("sb-a")
	if len(after) != 12 || after[11].Status != StatusHeld {
		t.Fatalf("effects after restart: %+v", after)
	}
	for i := range before {
		if !reflect.DeepEqual(before[i], after[i]) || len(after[i].History) != after[i].Attempts {
			t.Fatalf("effect %d changed across compaction and restart: %+v, then %+v", i, before[i], after[i])
		}
	}
	e2.register(2, "sb-a", basePolicy(up.hostPort()))
	if res, err := e2.p.Commit(e2.ctx, "sb-a"); err != nil || res.Released != 1 {
		t.Fatalf("commit after restart: %+v %v", res, err)
	}
	reqs := up.seen()
	if last := reqs[len(reqs)-1]; last.Path != "/later" || last.Body != "the body of a held effect" {
		t.Fatalf("held effect sent as %+v", last)
	}
}
