package proctpl

import (
	"sort"
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
