package orchestrator

import (
	"context"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// A rollback kills the processes started since the target through the freezer (pidfds of
// cgroup members), never by number: here the "new" pid is a host process outside any
// sandbox (as a pid reused since the listing would be), and it must survive.
func TestRollbackKillsThroughTheFreezerNotByNumber(t *testing.T) {
	r := newRig(t, 64)
	r.frz.procs = []pool.Proc{{Pid: 1, Start: 1}}
	c2 := r.checkpoint()
	host := exec.Command("sleep", "30")
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Process.Kill(); _ = host.Wait() })
	r.frz.procs = []pool.Proc{{Pid: 1, Start: 1}, {Pid: host.Process.Pid, Start: 2}}
	res, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.frz.killed, []int{host.Process.Pid}) || res.ProcessesStopped != 1 {
		t.Fatalf("freezer asked to kill %v (%d stopped), want only the new pid %d", r.frz.killed, res.ProcessesStopped, host.Process.Pid)
	}
	time.Sleep(50 * time.Millisecond)
	if err := host.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("host process was signalled by number: %v", err)
	}
	var ws syscall.WaitStatus
	if pid, _ := syscall.Wait4(host.Process.Pid, &ws, syscall.WNOHANG, nil); pid != 0 {
		t.Fatalf("host process exited: %v", ws)
	}
}
