package proxy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// A held effect exported from one sandbox and adopted by another is committed there once,
// under the Idempotency-Key it had; adopting again adds nothing; effects after the
// snapshot's watermark stay behind.
func TestCarryHeldEffects(t *testing.T) {
	u := newFaultUpstream(t, "ok", true)
	e, id := faultEnv(t, u)
	wm := e.p.Watermark("sb-a")
	later := holdPOST(t, e.client(2), u.URL+"/later", "x")
	data, err := e.p.ExportHeld(e.ctx, "sb-a", wm)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), id) || strings.Contains(string(data), later) || !strings.Contains(string(data), `"body"`) {
		t.Fatalf("exported %s: want %s with its body and not %s", data, id, later)
	}
	for range 2 {
		if n, err := e.p.AdoptHeld(e.ctx, "sb-b", data); err != nil {
			t.Fatal(err)
		} else if n > 1 {
			t.Fatalf("adopted %d effects", n)
		}
	}
	if got := e.p.Effects("sb-b", StatusHeld); len(got) != 1 || got[0].ID != id {
		t.Fatalf("sb-b holds %+v, want only %s", got, id)
	}
	if res, err := e.p.Commit(e.ctx, "sb-b"); err != nil || res.Released != 1 {
		t.Fatalf("commit of the adopted effect: %+v %v", res, err)
	}
	if res, err := e.p.Commit(e.ctx, "sb-a"); err != nil || res.Released != 2 { // the source sends it too: same key
		t.Fatalf("commit of the source: %+v %v", res, err)
	}
	keys, _ := u.seenKeys()
	if want := IdempotencyKey(id); len(keys) != 3 || keys[0] != want || keys[1] != want {
		t.Fatalf("keys %q: want %s twice (same key from both sandboxes), then the later effect's", keys, want)
	}
	if u.applied != 2 {
		t.Fatalf("upstream applied %d requests, want 2 (the key made the repeat a no-op)", u.applied)
	}
}

func TestAdoptHeldRefusesMalformed(t *testing.T) {
	e := newEnv(t)
	for _, bad := range []string{
		`{}`,
		`[{"id": "../x", "status": "held", "request": {"method": "POST", "url": "http://h/x"}}]`,
		`[{"id": "eff-000000000000000000000000", "status": "released", "request": {"method": "POST", "url": "http://h/x"}}]`,
		`[{"id": "eff-000000000000000000000000", "status": "held", "request": {"method": "POST", "url": "file:///etc/passwd"}}]`,
		`[{"id": "eff-000000000000000000000000", "status": "held", "compacted": true, "request": {"method": "POST", "url": "http://h/x"}}]`,
	} {
		if _, err := e.p.AdoptHeld(e.ctx, "sb-c", []byte(bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("adopt %s: %v, want invalid_argument", bad, err)
		}
	}
	if got := e.p.Effects("sb-c"); len(got) != 0 {
		t.Fatalf("a refused adoption left effects: %+v", got)
	}
	var none []json.RawMessage
	data, err := e.p.ExportHeld(e.ctx, "sb-none", 10)
	if err != nil || json.Unmarshal(data, &none) != nil || len(none) != 0 {
		t.Fatalf("export of a sandbox without a journal: %s %v", data, err)
	}
}
