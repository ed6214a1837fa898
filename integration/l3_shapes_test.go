package integration

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// shapesPy starts process shapes that report "<count> ok" in /tmp/shapes/<name>; see the
// file's comment.
//
//go:embed testdata/shapes.py
var shapesPy string

// restoringShapes are the shapes an L3 checkpoint must carry across a push and a restore on
// another node, and across an in-place rollback: each must keep counting from where it was.
var restoringShapes = []string{"daemon", "pgroup", "session", "pipe", "socketpair", "tcp", "unix",
	"deleted", "pty", "threads", "timers", "shm", "cwd"}

// stopShapes kills every process of shapes.py (the pattern does not match the shell's own
// command line) and removes the reports.
const stopShapes = `for p in /proc/[0-9]*; do grep -q 'shapes[.]py' $p/cmdline 2>/dev/null && kill -9 ${p#/proc/}; done; rm -rf /tmp/shapes`

// shapeStatus is one shape's report.
type shapeStatus struct {
	n     int
	state string // "ok" or "FAIL <why>"
}

// startShapes installs shapes.py in a sandbox and starts the named shapes.
func startShapes(d *daemon, id string, names ...string) {
	d.t.Helper()
	d.cli("exec", id, "--", "sh", "-c", "cat > /shapes.py <<'SHAPES_EOF'\n"+shapesPy+"\nSHAPES_EOF")
	d.cli(append([]string{"exec", id, "--timeout", "30s", "--", "python3", "/shapes.py"}, names...)...)
}

// shapes reads every shape's report.
func (d *daemon) shapes(id string) map[string]shapeStatus {
	d.t.Helper()
	out := d.cli("exec", id, "--", "sh", "-c", `cd /tmp/shapes 2>/dev/null && for f in *; do [ -f "$f" ] && printf '%s ' "$f" && cat "$f"; done; true`)
	got := map[string]shapeStatus{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.SplitN(line, " ", 3)
		if len(f) < 3 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			d.t.Fatalf("bad shape report %q", line)
		}
		got[f[0]] = shapeStatus{n: n, state: f[2]}
	}
	return got
}

// waitShapes polls the shapes' reports until every named shape reached its target count
// (want[name]); a failed shape, a missing one at the deadline, or a count below floor[name]
// (a shape restarted instead of restored) fails the test. It returns the last reports.
func waitShapes(t *testing.T, d *daemon, id, what string, names []string, want, floor map[string]int) map[string]shapeStatus {
	t.Helper()
	var last map[string]shapeStatus
	deadline := time.Now().Add(20 * time.Second)
	for {
		last = d.shapes(id)
		var pending []string
		for _, name := range names {
			st, ok := last[name]
			if ok && st.state != "ok" {
				t.Fatalf("%s: shape %s broke: %s", what, name, st.state)
			}
			if ok && st.n < floor[name] {
				t.Fatalf("%s: shape %s counts %d, below %d: it restarted instead of continuing", what, name, st.n, floor[name])
			}
			if !ok || st.n < want[name] {
				pending = append(pending, fmt.Sprintf("%s=%d/%d", name, st.n, want[name]))
			}
		}
		if len(pending) == 0 {
			t.Logf("%s: done", what)
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: shapes did not advance: %s (%v)", what, strings.Join(pending, " "), last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// plus returns each shape's count plus k.
func plus(st map[string]shapeStatus, k int) map[string]int {
	out := map[string]int{}
	for name, s := range st {
		out[name] = s.n + k
	}
	return out
}

func every(names []string, n int) map[string]int {
	out := map[string]int{}
	for _, name := range names {
		out[name] = n
	}
	return out
}

// criuVersion returns the daemon's CRIU version in go-criu's encoding (4.1.1 = 40101).
func (d *daemon) criuVersion() int {
	d.t.Helper()
	var info api.Info
	d.cliJSON(&info, "info")
	var v [3]int
	if _, err := fmt.Sscanf(info.CRIU.Version, "%d.%d.%d", &v[0], &v[1], &v[2]); err != nil {
		d.t.Fatalf("CRIU version %q: %v", info.CRIU.Version, err)
	}
	return v[0]*10000 + v[1]*100 + v[2]
}

// refusal is a shape the dump must refuse: the error must be failed_precondition, name the
// shape's process and carry the sentinel's reason.
type refusal struct {
	shape    string
	sentinel error
}

// TestL3ProcessShapes runs the process shapes that L3 carries in one sandbox, pushes it,
// restores it on a second node and checks that each shape continues from where it was
// (counters keep counting, connections still exchange data, the deleted file's content is
// intact, ...); then it rolls the first sandbox back to an L3 checkpoint in place and checks
// the same. Shapes CRIU cannot carry are refused at dump time, naming the process, and the
// refused sandbox keeps running; once they are gone its push passes.
func TestL3ProcessShapes(t *testing.T) {
	e1 := requireEnv(t)
	e2 := env{bin: e1.bin, containerd: testutil.RequiresEnv(t, "DELTABOX_CONTAINERD2_ADDRESS")}
	a := startDaemonOn(t, e1, "")
	b := startDaemonOn(t, e2, trustConfig(a)) // B trusts A's signing key
	store := "file://" + shortTempDir(t)
	a.createPool("py", pythonImage, 2, "--max", "8")
	b.createPool("py", pythonImage, 0, "--max", "4")
	id := a.lease("py").ID
	refused := a.lease("py").ID
	shapes := restoringShapes
	refusals := []refusal{{"inotify", criu.ErrInotifyOverlay}, {"unixgroup", criu.ErrHelperWithUnixSocket}}
	if !criu.InetSocketsDumpable(a.criuVersion()) {
		t.Logf("this CRIU cannot dump TCP sockets on this kernel: the tcp shape must be refused")
		shapes = slices.DeleteFunc(slices.Clone(shapes), func(s string) bool { return s == "tcp" })
		refusals = append(refusals, refusal{"tcp", criu.ErrInetSockets})
	}
	startShapes(a, id, shapes...)
	waitShapes(t, a, id, "before the push", shapes, every(shapes, 10), nil)

	// Push, restore on node B: every shape continues there, and in the original.
	before := a.shapes(id)
	var snap api.Snapshot
	lastJSON(t, a.cli("-o", "json", "snapshot", "push", id, "--to", store), &snap)
	var l api.Lease
	lastJSON(t, b.cli("-o", "json", "restore", snap.URI), &l)
	waitShapes(t, b, l.ID, "restored on node B", shapes, plus(before, 5), plus(before, 0))
	waitShapes(t, a, id, "the pushed original", shapes, plus(before, 5), plus(before, 0))

	// An L3 checkpoint, time passes, rollback: every shape is back at the checkpoint and runs on.
	// 100 ticks (5 s) pass before the rollback, so that a shape rolled back cannot have counted
	// past them again by the time it is read (the restore and that read take a second or more
	// on a loaded machine: 20 ticks were not enough there).
	at := a.shapes(id)
	var ck api.Checkpoint
	a.cliJSON(&ck, "checkpoint", "create", id, "--level", "l3")
	later := waitShapes(t, a, id, "after the checkpoint", shapes, plus(at, 100), nil)
	a.cli("rollback", id, "--to", ck.ID)
	back := waitShapes(t, a, id, "after the rollback", shapes, plus(at, 0), plus(at, 0))
	for _, name := range shapes {
		if back[name].n >= later[name].n {
			t.Errorf("shape %s at %d after the rollback, %d before it: not rolled back", name, back[name].n, later[name].n)
		}
	}
	waitShapes(t, a, id, "running on after the rollback", shapes, plus(back, 5), plus(at, 0))

	// Refused shapes, one at a time in the second sandbox.
	c, ctx := a.client(), context.Background()
	for _, r := range refusals {
		startShapes(a, refused, r.shape)
		only := []string{r.shape}
		waitShapes(t, a, refused, r.shape, only, every(only, 1), nil)
		_, err := c.SnapshotPush(ctx, refused, store, nil)
		want := "(shape-" + r.shape + ", host pid"
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), r.sentinel.Error()) {
			t.Fatalf("push with shape %s: want failed_precondition naming %q and saying %q, got %v", r.shape, want, r.sentinel, err)
		}
		t.Logf("%s refused: %v", r.shape, err)
		waitShapes(t, a, refused, r.shape+" after the refusal", only, plus(a.shapes(refused), 3), nil)
		a.cli("exec", refused, "--", "sh", "-c", stopShapes)
	}
	if _, err := c.SnapshotPush(ctx, refused, store, nil); err != nil {
		t.Fatalf("push after the refused shapes stopped: %v", err)
	}
}
