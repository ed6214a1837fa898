package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestDetachedExecSurvivesDaemonKill (issue 19): a detached exec (exec -d) goes on running
// when the daemon is killed with SIGKILL; the restarted daemon lists it (ps), shows its output
// from before and during the restart (logs) and reports its exit code when it ends.
func TestDetachedExecSurvivesDaemonKill(t *testing.T) {
	d := startDaemon(t)
	d.createPool("detach", busyboxImage, 1)
	l := d.lease("detach")
	gate := "/tmp/detach-gate"
	script := "echo before; sleep 1; echo during; while [ ! -e " + gate + " ]; do sleep 0.05; done; echo after; echo oops >&2; exit 5"
	proc := strings.TrimSpace(d.cli("exec", "-d", l.ID, "sh", "-c", script))
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the first output in the log", func() bool {
		return strings.Contains(d.cli("logs", l.ID, proc), "before")
	})
	d.kill()
	time.Sleep(1500 * time.Millisecond) // "during" is written while no daemon runs: the init keeps it
	d.start()
	var ps []api.Proc
	d.cliJSON(&ps, "ps", l.ID)
	if len(ps) != 1 || ps[0].Proc != proc || ps[0].State != api.ProcRunning {
		t.Fatalf("ps after the restart: %+v, want %s running", ps, proc)
	}
	d.cli("exec", l.ID, "--", "touch", gate)
	out, errOut, code := d.cliRaw("logs", "-f", l.ID, proc)
	if out != "before\nduring\nafter\n" || errOut != "oops\n" || code != 0 {
		t.Fatalf("logs -f after the restart: stdout %q stderr %q exit %d", out, errOut, code)
	}
	d.cliJSON(&ps, "ps", l.ID)
	if len(ps) != 1 || ps[0].State != api.ProcExited || ps[0].Exit == nil || ps[0].Exit.Code != 5 {
		t.Fatalf("ps after the end: %+v, want exited with code 5", ps)
	}
	// A restart after the end keeps the record (and its exit code); new procs get new IDs.
	d.kill()
	d.start()
	d.cliJSON(&ps, "ps", l.ID)
	if len(ps) != 1 || ps[0].Exit == nil || ps[0].Exit.Code != 5 {
		t.Fatalf("ps after a second restart: %+v", ps)
	}
	if next := strings.TrimSpace(d.cli("exec", "-d", l.ID, "true")); next == proc {
		t.Fatalf("a new detached exec reused the ID %s", proc)
	}
}
