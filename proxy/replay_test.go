package proxy

import (
	"net/http"
	"strings"
	"testing"
)

const recordPolicy = `version: 1
default: deny
rules:
  - host: 127.0.0.1
    path_prefix: /rec
    action: pass
    record: true
  - host: 127.0.0.1
    action: pass
`

// TestRecordAndReplay: answers of record rules are kept; in replay mode an identical request
// gets the kept answer without reaching the upstream, a different one (other body, other
// URL) passes; a fork given the recordings replays them too; rules without record never replay.
func TestRecordAndReplay(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t)
	e.register(2, "sb-a", recordPolicy)
	e.register(3, "sb-b", recordPolicy)
	get := func(n int, path, body string) (string, string) {
		t.Helper()
		method, rd := http.MethodGet, (*strings.Reader)(nil)
		if body != "" {
			method, rd = http.MethodPost, strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, up.URL+path, nil)
		if rd != nil {
			req, _ = http.NewRequest(method, up.URL+path, rd)
		}
		resp, err := e.client(n).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return mustStatus(t, resp, 200), resp.Header.Get(HeaderReplayed)
	}
	get(2, "/rec/a", "")
	get(2, "/rec/p", "one")
	get(2, "/other", "")
	if n := len(up.seen()); n != 3 {
		t.Fatalf("upstream saw %d requests, want 3", n)
	}
	e.p.SetReplay("sb-a", true)
	if body, replayed := get(2, "/rec/a", ""); body != "hello GET /rec/a" || replayed != "1" {
		t.Fatalf("replayed answer %q (%q)", body, replayed)
	}
	get(2, "/rec/p", "one")
	get(2, "/rec/p", "two") // another body: passes (and is recorded)
	get(2, "/other", "")    // no record rule: passes
	if n := len(up.seen()); n != 5 {
		t.Fatalf("upstream saw %d requests, want 5 (two replayed)", n)
	}
	e.p.CopyRecordings("sb-a", "sb-b", true)
	if _, replayed := get(3, "/rec/a", ""); replayed != "1" {
		t.Fatal("the fork does not replay its source's recordings")
	}
	e.p.SetReplay("sb-a", false)
	if _, replayed := get(2, "/rec/a", ""); replayed != "" {
		t.Fatal("replayed with replay off")
	}
	if n := len(up.seen()); n != 6 {
		t.Fatalf("upstream saw %d requests, want 6", n)
	}
	if _, err := ParsePolicy([]byte("version: 1\nrules:\n  - host: x\n    action: hold\n    record: true\n")); err == nil {
		t.Fatal("record accepted on a hold rule")
	}
}
