package orchestrator

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// A rollback to a checkpoint with processes kills every process but the init to replace
// them with copies, except the checkpoint's processes it cannot bring back (no template:
// the daemon restarted, or none could be made): those run on as they are, and the result
// lists them with the reason.
func TestRollbackWithProcessesKeepsWhatItCannotRestore(t *testing.T) {
	r := newRig(t, 64)
	r.s.sb.InitPid = 1
	r.frz.procs = []pool.Proc{{Pid: 1, Start: 1}, {Pid: 2, Start: 2}, {Pid: 3, Start: 3}}
	c2 := r.checkpoint()
	i := r.s.find(c2)
	r.s.ckpts[i].ProcCkpt = &procCheckpoint{Procs: []procEntry{
		{Proc: pool.Proc{Pid: 2, Start: 2}, NSPid: 20, Comm: "python3", Kept: api.KeptTemplate},
		{Proc: pool.Proc{Pid: 3, Start: 3}, NSPid: 30, Comm: "java", Kept: api.KeptNone, Reason: "multi-threaded"},
	}}
	r.s.tplDropped = map[string]string{c2: "its template was dropped: template_memory exceeded"}
	// now: the init, the process without template (3), a new one (4) and pid 2 reused by a
	// new process (the checkpoint's pid 2 is gone)
	r.frz.procs = []pool.Proc{{Pid: 1, Start: 1}, {Pid: 3, Start: 3}, {Pid: 4, Start: 4}, {Pid: 2, Start: 99}}
	res, err := r.o.Rollback(context.Background(), "sb", api.RollbackRequest{To: c2})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.frz.killed)
	if !slices.Equal(r.frz.killed, []int{2, 4}) {
		t.Fatalf("killed %v, want the new processes (4, and 2 started at 99)", r.frz.killed)
	}
	if res.ProcessesRestored != 0 || len(res.ProcessesLost) != 2 {
		t.Fatalf("result: %+v", res)
	}
	for _, p := range res.ProcessesLost {
		want := map[int]string{20: "template_memory exceeded", 30: "multi-threaded"}[p.Pid]
		if want == "" || !strings.Contains(p.Reason, want) || !strings.Contains(p.Reason, "left running") {
			t.Errorf("lost %+v: reason should say %q and that it was left running", p, want)
		}
	}
	v := r.s.view(r.s.ckpts[i])
	if len(v.Processes) != 2 || v.Processes[0].Kept != api.KeptNone || !strings.Contains(v.Processes[0].Reason, "template_memory") {
		t.Errorf("checkpoint view: %+v", v.Processes)
	}
}

// An l3 checkpoint asks for processes through CRIU: the processes flag is refused with it,
// and a pool default does not apply to it.
func TestProcessesFlagIsForL1AndL2(t *testing.T) {
	r := newRig(t, 64)
	yes := true
	_, err := r.o.checkpoint(context.Background(), r.s, api.CheckpointRequest{Level: api.LevelL3, Processes: &yes})
	if err == nil || !strings.Contains(err.Error(), "--processes is for l1 and l2") {
		t.Fatalf("l3 with processes: %v", err)
	}
}
