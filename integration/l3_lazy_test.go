package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// sumScript holds 50 MiB of random heap and its SHA-256 taken at start, counts in /tmp/count,
// and on each request (a new /tmp/check) hashes the heap again into /tmp/sum: a restore that
// lost or zeroed a page gives "BAD".
const sumScript = `cat > /sum.py <<'PY'
import hashlib, os, time
heap = bytearray(os.urandom(50 << 20))
want = hashlib.sha256(heap).hexdigest()
i, seen = 0, 0
while True:
    i += 1
    with open("/tmp/count.new", "w") as f:
        f.write(str(i))
    os.rename("/tmp/count.new", "/tmp/count")
    try:
        n = os.stat("/tmp/check").st_mtime_ns
    except FileNotFoundError:
        n = 0
    if n != seen:
        seen = n
        got = hashlib.sha256(heap).hexdigest()
        with open("/tmp/sum.new", "w") as f:
            f.write(("ok " if got == want else "BAD ") + got)
        os.rename("/tmp/sum.new", "/tmp/sum")
    time.sleep(0.02)
PY
nohup python3 /sum.py >/dev/null 2>&1 &
while [ ! -s /tmp/count ]; do sleep 0.05; done`

// TestL3LazyRestore: with lazy_restore on, in a pool without a user namespace an L3 rollback is lazy (the daemon's
// deltabox_l3_lazy_restores_total counts it) and brings back every byte of a 50 MiB random
// heap, twice; a snapshot restored as a new sandbox is lazy too and has the heap whole.
func TestL3LazyRestore(t *testing.T) {
	d := startDaemonWith(t, "[metrics]\naddress = \"127.0.0.1:19465\"\n[snapshots]\nlazy_restore = true\n")
	d.createPool("lz", pythonImage, 1, "--max", "4", "--no-userns")
	id := d.lease("lz").ID
	d.cli("exec", id, "--timeout", "60s", "--", "sh", "-c", sumScript)
	lazy := func() int {
		for _, line := range strings.Split(httpGet(t, "http://127.0.0.1:19465/metrics"), "\n") {
			if v, ok := strings.CutPrefix(line, "deltabox_l3_lazy_restores_total "); ok {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil {
					t.Fatalf("deltabox_l3_lazy_restores_total %q: %v", v, err)
				}
				return n
			}
		}
		t.Fatal("no deltabox_l3_lazy_restores_total in the metrics")
		return 0
	}
	check := func(sb, what string) {
		t.Helper()
		d.cli("exec", sb, "--", "sh", "-c", "rm -f /tmp/sum; touch /tmp/check")
		var got string
		testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "the heap's sum "+what, func() bool {
			out, _, code := d.cliRaw("exec", sb, "--", "cat", "/tmp/sum")
			got = out
			return code == 0 && out != ""
		})
		if !strings.HasPrefix(got, "ok ") {
			t.Fatalf("heap after %s: %q", what, got)
		}
	}
	check(id, "start")
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--level", "l3")
	for round := 1; round <= 2; round++ {
		d.cli("exec", id, "--", "touch", "/after")
		before := lazy()
		d.cli("rollback", id, "--to", ck.ID)
		if got := lazy(); got != before+1 {
			t.Fatalf("rollback %d: lazy restores %d -> %d, want one more", round, before, got)
		}
		if _, _, code := d.cliRaw("exec", id, "--", "test", "-e", "/after"); code == 0 {
			t.Fatalf("rollback %d: /after is still there", round)
		}
		check(id, "rollback")
	}
	var snap api.Snapshot
	lastJSON(t, d.cli("-o", "json", "snapshot", "push", id), &snap)
	before := lazy()
	var l api.Lease
	lastJSON(t, d.cli("-o", "json", "restore", snap.URI), &l)
	if got := lazy(); got != before+1 {
		t.Fatalf("restore: lazy restores %d -> %d, want one more", before, got)
	}
	check(l.ID, "restore as a new sandbox")
}
