package orchestrator

import (
	"fmt"

	"github.com/deltabox/deltabox/criu/proctpl"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// A process a template cannot copy (a multi-threaded one: a fork copies one thread) is kept
// by CRIU instead. CRIU dumps whole pid namespaces only (not a subtree of one), so the
// fallback is per sandbox: a checkpoint with processes of a sandbox that has a
// multi-threaded process becomes an L3 checkpoint, which keeps every process with CRIU and
// restores them in place on rollback. It needs what L3 needs (CRIU on the node, a sandbox
// without a user namespace) and no live templates (CRIU cannot dump processes the daemon
// traces); otherwise the multi-threaded processes are kept by no one, and say why.

// criuFallback says why a checkpoint with processes of s, whose run lists procs (templates
// left out), must go to CRIU (fallback), or, when it should but cannot, why not
// (noFallback). Both empty: templates serve.
func (o *Orchestrator) criuFallback(s *session, procs []pool.Proc) (fallback, noFallback string) {
	mt := ""
	for _, p := range procs {
		if p.Pid == int(s.sb.InitPid) || exited(p.Pid) {
			continue
		}
		if n, err := proctpl.Threads(p.Pid); err == nil && n > 1 {
			ns, comm := nsPidComm(p.Pid)
			mt = fmt.Sprintf("process %d (%s) has %d threads, which a template cannot copy", ns, comm, n)
			break
		}
	}
	switch {
	case mt == "":
		return "", ""
	case !o.criu.Available:
		return "", "CRIU is unavailable on this node: " + o.criu.Reason
	case len(s.templateCheckpoints()) > 0:
		return "", fmt.Sprintf("checkpoints %v hold templates, and CRIU cannot dump the processes the daemon traces", s.templateCheckpoints())
	}
	return mt + ": the whole sandbox is dumped by CRIU (l3)", ""
}

// criuEntries lists the processes an L3 checkpoint taken for processes keeps.
func (s *session) criuEntries(procs []pool.Proc, why string) *procCheckpoint {
	pc := &procCheckpoint{Procs: []procEntry{}}
	for _, p := range procs {
		if p.Pid == int(s.sb.InitPid) {
			continue
		}
		e := procEntry{Proc: p, Kept: api.KeptCRIU, Reason: why}
		e.NSPid, e.Comm = nsPidComm(p.Pid)
		pc.Procs = append(pc.Procs, e)
	}
	return pc
}
