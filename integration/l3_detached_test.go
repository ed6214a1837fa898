package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestL3WithDetachedExec: an L3 checkpoint is taken while a detached exec (a server a user
// started with exec -d) runs and the daemon follows its output: the daemon's connection
// steps aside for the dump and follows again after it, so nothing of the output is lost and
// the exit code arrives. A rollback to that checkpoint restores the command (the init hands
// it over when it executes itself again) and the daemon follows the restored one; a
// detached exec started after the checkpoint is reported lost by the rollback.
func TestL3WithDetachedExec(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	gate := "/tmp/gate"
	script := "i=0; while [ ! -e " + gate + " ]; do i=$((i+1)); echo tick$i; sleep 0.1; done; echo bye; exit 7"
	proc := strings.TrimSpace(d.cli("exec", "-d", id, "sh", "-c", script))
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the first ticks", func() bool {
		return strings.Contains(d.cli("logs", id, proc), "tick3")
	})
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--level", "l3")
	before := strings.Count(d.cli("logs", id, proc), "tick")
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "ticks after the checkpoint, followed again", func() bool {
		return strings.Count(d.cli("logs", id, proc), "tick") > before+3
	})
	later := strings.TrimSpace(d.cli("exec", "-d", id, "sleep", "100"))
	d.cli("rollback", id, "--to", ck.ID)
	var ps []api.Proc
	testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "the later exec to be reported lost", func() bool {
		d.cliJSON(&ps, "ps", id)
		for _, p := range ps {
			if p.Proc == later {
				return p.State == api.ProcExited && p.Error != ""
			}
		}
		return false
	})
	d.cli("exec", id, "--", "touch", gate)
	out, errOut, code := d.cliRaw("logs", "-f", id, proc)
	if code != 0 || !strings.Contains(out, "tick1\n") || !strings.HasSuffix(out, "bye\n") {
		t.Fatalf("logs -f of the detached exec across the checkpoint and the rollback: exit %d, %q %q", code, out, errOut)
	}
	d.cliJSON(&ps, "ps", id)
	for _, p := range ps {
		if p.Proc == proc && (p.Exit == nil || p.Exit.Code != 7) {
			t.Fatalf("ps: %+v, want %s exited with 7", ps, proc)
		}
	}
}
