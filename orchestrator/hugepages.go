package orchestrator

import (
	"context"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/criu/proctpl"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/pool"
)

// hugePages runs before the freeze of a checkpoint with processes: the processes of the
// sandbox (procs: its run, without templates) that have not had a chance yet get their dense
// private memory collapsed into huge pages, within Options.HugePagesBudget, so that their
// templates, and the copies forked from those, are forked in a fraction of the time
// (proctpl.CollapseHuge says why and what it leaves alone). A process has one chance, at the
// first checkpoint that sees it: once a template shares its memory, collapsing would copy
// it. The copies a rollback starts share their template's pages and are marked as seen when
// they start. The sandbox runs meanwhile; a process that exits or is not the one listed is
// skipped.
func (o *Orchestrator) hugePages(ctx context.Context, s *session, procs []pool.Proc) {
	if o.opts.HugePagesBudget <= 0 || o.hugeOff() {
		return
	}
	seen := make(map[int]bool, len(procs))
	var todo []pool.Proc
	for _, p := range procs {
		seen[p.Pid] = true
		if !s.hugeSeen[p.Pid] && p.Pid != int(s.sb.InitPid) {
			todo = append(todo, p)
		}
	}
	s.hugeSeen = seen // the pids gone since are dropped
	if len(todo) == 0 {
		return
	}
	start := time.Now()
	deadline := start.Add(o.opts.HugePagesBudget)
	var total proctpl.HugeResult
	for _, p := range todo {
		if time.Now().After(deadline) {
			break
		}
		fd, err := unix.PidfdOpen(p.Pid, 0)
		if err != nil {
			continue
		}
		if s.checkMember(p.Pid, p.Start) == nil { // the pidfd is the listed process's
			res, err := proctpl.CollapseHuge(fd, p.Pid, deadline)
			if err != nil {
				log.L(ctx).Debug("huge pages", "sandbox", s.id, "pid", p.Pid, "error", err)
			}
			total.Dense += res.Dense
			total.Collapsed += res.Collapsed
		}
		unix.Close(fd)
	}
	log.L(ctx).Debug("huge pages before the first templates", "sandbox", s.id, "processes", len(todo),
		"dense", total.Dense, "collapsed", total.Collapsed, "took", time.Since(start))
}

// hugeOff reports whether the node cannot collapse memory (transparent huge pages off),
// read once.
func (o *Orchestrator) hugeOff() bool {
	o.hugeOnce.Do(func() { o.hugeUnusable = proctpl.HugePagesUsable() != nil })
	return o.hugeUnusable
}

// sawHuge marks pid (a copy a rollback started) as having had its chance at huge pages.
// Callers hold s.mu.
func (s *session) sawHuge(pid int) {
	if pid == 0 {
		return
	}
	if s.hugeSeen == nil {
		s.hugeSeen = map[int]bool{}
	}
	s.hugeSeen[pid] = true
}
