package proctpl

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// BenchmarkTemplateAndCopy measures the mechanism alone on a host python3 with 50 MB of
// heap: making a template (seize, stop, inject the fork, hide, resume) and a rollback of the
// process (SIGKILL of the current copy, a fresh copy from the template: the reap of the
// killed one is left to the background, as in the daemon).
func BenchmarkTemplateAndCopy(b *testing.B) {
	testutil.RequiresRoot(b)
	tr := NewTracer()
	r := startREPL(b)
	r.eval(b, "import os; heap = bytearray(os.urandom(50 << 20))")
	var mk, cp []time.Duration
	pid := r.cmd.Process.Pid
	for i := 0; i < b.N; i++ {
		start := time.Now()
		p, err := tr.Seize(pid, noCheck)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Wait(); err != nil {
			b.Fatal(err)
		}
		tp, err := p.Template()
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Resume(); err != nil {
			b.Fatal(err)
		}
		mk = append(mk, time.Since(start))
		start = time.Now()
		_ = unix.Kill(pid, unix.SIGKILL)
		c, err := tp.Copy()
		if err != nil {
			b.Fatal(err)
		}
		cp = append(cp, time.Since(start))
		var ws unix.WaitStatus
		if pid != r.cmd.Process.Pid {
			_, _ = unix.Wait4(pid, &ws, 0, nil)
		}
		pid = c
		r.eval(b, "1")
		tp.Release()
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	report := func(s []time.Duration, name string) {
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(s[len(s)*99/100].Microseconds())/1000, name+"-p99-ms")
	}
	report(mk, "template")
	report(cp, "copy")
}

// BenchmarkTemplateLineage measures what a process's lineage of live templates costs its
// next template: b.N generations of (template of the running copy, spare forked from it,
// the running copy killed, the spare started), as checkpoints and rollbacks to them do,
// with the last keep templates alive (the daemon's template_checkpoints) against every one
// kept. The REPL's 50 MB heap is collapsed into huge pages first, as the daemon does, so
// that the fork's page-table copy does not hide the rest. It reports the template's p50
// over the second half of the generations and, where /proc/slabinfo is readable, the
// anon_vma_chain entries each template's fork adds (one per private memory area per live
// level of its ancestry).
func BenchmarkTemplateLineage(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, keep := range []int{4, 16, 0} {
		name := fmt.Sprintf("keep-%d", keep)
		if keep == 0 {
			name = "keep-all"
		}
		b.Run(name, func(b *testing.B) { benchLineage(b, keep) })
	}
}

func benchLineage(b *testing.B, keep int) {
	tr := NewTracer()
	r := startREPL(b)
	r.eval(b, "import os; heap = bytearray(os.urandom(50 << 20))")
	pid := r.cmd.Process.Pid
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		_, _ = CollapseHuge(fd, pid, time.Now().Add(10*time.Second))
		unix.Close(fd)
	}
	var kept []*Template
	defer func() {
		for _, k := range kept {
			k.Release()
		}
	}()
	var took []time.Duration
	var links []int
	for i := 0; i < b.N; i++ {
		p := stopped(b, tr, pid)
		before := slabObjects("anon_vma_chain")
		start := time.Now()
		tp, err := p.Template()
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		after := slabObjects("anon_vma_chain")
		if err := p.Resume(); err != nil {
			b.Fatal(err)
		}
		if i >= b.N/2 {
			took = append(took, d)
			if before >= 0 && after >= 0 {
				links = append(links, after-before)
			}
		}
		if err := tp.Prefork(nil); err != nil {
			b.Fatal(err)
		}
		if kept = append(kept, tp); keep > 0 && len(kept) > keep {
			kept[0].Release()
			kept = kept[1:]
		}
		_ = unix.Kill(pid, unix.SIGKILL)
		if pid != r.cmd.Process.Pid {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, 0, nil)
		}
		if pid, err = tp.Copy(); err != nil {
			b.Fatal(err)
		}
		r.eval(b, fmt.Sprintf("heap[%d] = 1", i*4096%(50<<20)))
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	if len(took) == 0 {
		return
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "template-p50-ms")
	if len(links) > 0 {
		sort.Ints(links)
		b.ReportMetric(float64(links[len(links)/2]), "avc-per-fork")
	}
}

// slabObjects reads the active objects of a slab cache from /proc/slabinfo (-1: unreadable,
// or the cache is merged into another).
func slabObjects(name string) int {
	data, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == name {
			if n, err := strconv.Atoi(f[1]); err == nil {
				return n
			}
		}
	}
	return -1
}
