//go:build linux

package overlay

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmarks run on a real overlay mount. Each reports p50/p99 of per-iteration durations
// (b.ReportMetric, ns); captures are durable (fsync) unless stated.
//
//	go test -run '^$' -bench . -benchtime 200x ./overlay

// benchTree creates files spread over directories of 100 files in the upper dir (before the
// first capture, through the merged mount).
func benchTree(b testing.TB, f *fixture, files int) []string { return benchTreeIn(b, f, files, 100) }

// benchTreeIn creates files spread over directories of perDir files.
func benchTreeIn(b testing.TB, f *fixture, files, perDir int) []string {
	b.Helper()
	var paths []string
	content := make([]byte, 4096)
	for i := 0; i < files; i++ {
		p := filepath.Join(fmt.Sprintf("d%03d", i/perDir), fmt.Sprintf("f%05d", i))
		if i%perDir == 0 {
			must(b, os.MkdirAll(f.m(filepath.Dir(p)), 0o755))
		}
		must(b, os.WriteFile(f.m(p), content, 0o644))
		paths = append(paths, p)
	}
	return paths
}

// modify rewrites n files (spread over the tree) with 4 KiB of new content.
func modify(b testing.TB, f *fixture, paths []string, n, round int) {
	b.Helper()
	content := make([]byte, 4096)
	for i := range content {
		content[i] = byte(round)
	}
	step := max(len(paths)/n, 1)
	for i := 0; i < n; i++ {
		must(b, os.WriteFile(f.m(paths[(i*step+round)%len(paths)]), content, 0o644))
	}
}

type latencies []time.Duration

func (l latencies) report(b *testing.B) { l.reportAs(b, "") }

// reportAs reports p50 and p99 under the given metric prefix.
func (l latencies) reportAs(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	pct := func(p float64) float64 { return float64(l[min(int(p*float64(len(l))), len(l)-1)].Nanoseconds()) }
	b.ReportMetric(pct(0.50), prefix+"p50-ns")
	b.ReportMetric(pct(0.99), prefix+"p99-ns")
	b.ReportMetric(0, "ns/op")
}

// cpuTime is the process's user+system CPU time so far. Per-operation CPU time is far less
// sensitive than latency to other load on a shared machine (it still counts background
// goroutines that happen to run meanwhile).
func cpuTime() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchCapture(b *testing.B, files, changed int, opts ...Option) {
	benchCaptureIn(b, files, 100, changed, opts...)
}

func benchCaptureIn(b *testing.B, files, perDir, changed int, opts ...Option) {
	f := newFixture(b, nil, opts...)
	paths := benchTreeIn(b, f, files, perDir)
	f.capture(b, "base", L2)
	var lat, cpu latencies
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		modify(b, f, paths, changed, i)
		b.StartTimer()
		start, c0 := time.Now(), cpuTime()
		res := f.capture(b, fmt.Sprintf("c%d", i), L1)
		lat, cpu = append(lat, time.Since(start)), append(cpu, cpuTime()-c0)
		if res.FilesChanged < changed {
			b.Fatalf("captured %d changes, want >= %d", res.FilesChanged, changed)
		}
	}
	lat.report(b)
	cpu.reportAs(b, "cpu-")
}

// BenchmarkCaptureL1 is the headline: 10 changed 4 KiB files in a 5,000-file upper dir.
func BenchmarkCaptureL1(b *testing.B) { benchCapture(b, 5000, 10) }

// BenchmarkCaptureL1Walk is the headline case without the change tracker: every capture
// walks the whole upper dir (the baseline of BenchmarkCaptureL1, measured in the same run).
func BenchmarkCaptureL1Walk(b *testing.B) { benchCapture(b, 5000, 10, WithoutTracking()) }

// BenchmarkCaptureL1NoSync is the same without fsync (the scan + copy cost alone).
func BenchmarkCaptureL1NoSync(b *testing.B) { benchCapture(b, 5000, 10, WithoutSync()) }

// BenchmarkCaptureFlat is the headline case with all 5,000 files in one directory, which the
// scan splits into chunks across its workers.
func BenchmarkCaptureFlat(b *testing.B) { benchCaptureIn(b, 5000, 5000, 10) }

// BenchmarkCaptureChanged grows the number of changed files at a fixed 5k tree.
func BenchmarkCaptureChanged(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("changed=%d", n), func(b *testing.B) { benchCapture(b, 5000, n) })
	}
}

// BenchmarkCaptureTree grows the tree at 10 changed files.
func BenchmarkCaptureTree(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) { benchCapture(b, n, 10) })
	}
	for _, n := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprintf("walk/files=%d", n), func(b *testing.B) { benchCapture(b, n, 10, WithoutTracking()) })
	}
}

// BenchmarkRollbackStep undoes one step: 10 changed files captured in a checkpoint after the
// target, rolled back to the target (which discards that checkpoint).
func BenchmarkRollbackStep(b *testing.B) { rollbackStep(b, false) }

// BenchmarkRollbackStepDeferred is BenchmarkRollbackStep with the record deferred, as the
// daemon rolls back: the latency is the part done while the sandbox is frozen; the record
// written after (PersistRollback) is reported as persist-p50-ns.
func BenchmarkRollbackStepDeferred(b *testing.B) { rollbackStep(b, true) }

func rollbackStep(b *testing.B, deferred bool) {
	f := newFixture(b, nil)
	paths := benchTree(b, f, 5000)
	f.capture(b, "base", L2)
	var lat, cpu, persist latencies
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		modify(b, f, paths, 10, i+1)
		f.capture(b, fmt.Sprintf("step%d", i), L1) // checkpoints are a tree: rollback deletes none
		b.StartTimer()
		start, c0 := time.Now(), cpuTime()
		res, err := f.s.Rollback(context.Background(), RollbackRequest{Merged: f.merged, Upper: f.upper,
			Lower: []string{f.lower}, Target: "base", Deferred: deferred})
		lat, cpu = append(lat, time.Since(start)), append(cpu, cpuTime()-c0)
		if err != nil || res.FilesRestored < 10 {
			b.Fatalf("rollback: %v, want >= 10 files restored", err)
		}
		if deferred {
			start = time.Now()
			must(b, f.s.PersistRollback())
			persist = append(persist, time.Since(start))
		}
	}
	lat.report(b)
	cpu.reportAs(b, "cpu-")
	if deferred {
		persist.reportAs(b, "persist-")
	}
}

// BenchmarkRollbackHead is the daemon's files-only rollback (integration
// BenchmarkCheckpointRollback): a checkpoint, then 10 files changed and not captured, then a
// deferred rollback to that checkpoint (the head), its record put in place (WriteRollback,
// reported as write-) and synced (PersistRollback, persist-) after it, as the daemon does.
func BenchmarkRollbackHead(b *testing.B) {
	f := newFixture(b, nil)
	paths := benchTree(b, f, 5000)
	f.capture(b, "base", L2)
	var lat, cpu, write, persist latencies
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		if i%10 == 9 { // a task of ten steps ends: keep the chain short (untimed)
			f.rollback(b, "base")
		}
		modify(b, f, paths, 10, 2*i+1)
		id := fmt.Sprintf("step%d", i)
		f.capture(b, id, L1)
		modify(b, f, paths, 10, 2*i+2)
		b.StartTimer()
		start, c0 := time.Now(), cpuTime()
		res, err := f.s.Rollback(context.Background(), RollbackRequest{Merged: f.merged, Upper: f.upper,
			Lower: []string{f.lower}, Target: id, Deferred: true})
		lat, cpu = append(lat, time.Since(start)), append(cpu, cpuTime()-c0)
		if err != nil || res.FilesRestored < 10 {
			b.Fatalf("rollback: %v, want >= 10 files restored", err)
		}
		start = time.Now()
		must(b, f.s.WriteRollback())
		write = append(write, time.Since(start))
		start = time.Now()
		must(b, f.s.PersistRollback())
		persist = append(persist, time.Since(start))
	}
	lat.report(b)
	cpu.reportAs(b, "cpu-")
	write.reportAs(b, "write-")
	persist.reportAs(b, "persist-")
}

// BenchmarkVerify is a full Verify (5,000 4 KiB files, contents compared) right after a capture.
func BenchmarkVerify(b *testing.B) {
	f := newFixture(b, nil)
	benchTree(b, f, 5000)
	f.capture(b, "base", L2)
	var lat latencies
	for b.Loop() {
		start := time.Now()
		ms, err := f.s.Verify(b.Context(), "base", f.merged)
		lat = append(lat, time.Since(start))
		if err != nil || len(ms) > 0 {
			b.Fatalf("verify: %v, %d mismatches", err, len(ms))
		}
	}
	lat.report(b)
}

// BenchmarkBaselineWalkDir is what a naive change detector pays for the same 5,000-file upper
// dir before doing anything: filepath.WalkDir plus an Lstat of every entry (no copy, no
// fsync). Compare its p50 with BenchmarkCaptureL1NoSync's.
func BenchmarkBaselineWalkDir(b *testing.B) {
	f := newFixture(b, nil)
	benchTree(b, f, 5000)
	var lat latencies
	for b.Loop() {
		start := time.Now()
		n := 0
		err := filepath.WalkDir(f.upper, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			_, err = d.Info() // an lstat: WalkDir never follows symlinks
			n++
			return err
		})
		lat = append(lat, time.Since(start))
		if err != nil || n < 5000 {
			b.Fatalf("walk: %d entries, %v", n, err)
		}
	}
	lat.report(b)
}

// BenchmarkWriteTax is what the change tracker's filesystem mark costs a sandbox's writes:
// 64-byte write(2)s to one file through the merged mount, with the tracker on and off (the
// mark exists only while some store tracks an upper dir on the filesystem).
func BenchmarkWriteTax(b *testing.B) {
	for _, track := range []bool{false, true} {
		b.Run(fmt.Sprintf("tracked=%t", track), func(b *testing.B) {
			var opts []Option
			if !track {
				opts = append(opts, WithoutTracking())
			}
			f := newFixture(b, nil, opts...)
			f.capture(b, "c0", L1)
			f.capture(b, "c1", L1)
			fh, err := os.Create(f.m("log"))
			must(b, err)
			defer fh.Close()
			buf := make([]byte, 64)
			b.ResetTimer()
			for b.Loop() {
				if _, err := fh.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRestoreInto is the file part of `fork --from`: a checkpoint whose upper dir holds
// 5,000 files (100 changed since the previous checkpoint) written into a fresh overlay of the
// same image (a new fixture per iteration, not timed).
func BenchmarkRestoreInto(b *testing.B) {
	src := newFixture(b, nil)
	paths := benchTree(b, src, 5000)
	src.capture(b, "c0", L1)
	modify(b, src, paths, 100, 1)
	src.capture(b, "c1", L1)
	var lat latencies
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dst := newFixture(b, nil)
		b.StartTimer()
		start := time.Now()
		if _, err := src.s.RestoreInto(b.Context(), "c1", RollbackRequest{Merged: dst.merged, Upper: dst.upper, Lower: []string{dst.lower}}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	lat.report(b)
}

// BenchmarkWriteLower is the file part of `fork --from` on a shared layer: the same checkpoint
// (5,000 files, 100 changed since the previous checkpoint) written once as a lower layer, on
// the test's filesystem (disk) and on a tmpfs (where the daemon keeps layers that fit).
func BenchmarkWriteLower(b *testing.B) {
	src := newFixture(b, nil)
	paths := benchTree(b, src, 5000)
	src.capture(b, "c0", L1)
	modify(b, src, paths, 100, 1)
	src.capture(b, "c1", L1)
	for _, fs := range []string{"disk", "tmpfs"} {
		b.Run(fs, func(b *testing.B) {
			base := b.TempDir()
			if fs == "tmpfs" {
				if err := unix.Mount("tmpfs", base, "tmpfs", 0, "size=256m"); err != nil {
					b.Fatal(err)
				}
				defer func() { _ = unix.Unmount(base, unix.MNT_DETACH) }()
			}
			var lat latencies
			for i := 0; i < b.N; i++ {
				dir := filepath.Join(base, fmt.Sprint(i))
				start := time.Now()
				if _, err := src.s.WriteLower(b.Context(), "c1", LowerRequest{Dir: dir}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				must(b, os.RemoveAll(dir)) // as when its last fork goes
				b.StartTimer()
			}
			lat.report(b)
		})
	}
}

// BenchmarkDeleteFull is retention's merge: a full checkpoint of 5,000 files (of 16 bytes,
// as a source tree's small files, or 4 KiB) is deleted, folded into its child (10 files
// changed), on this filesystem (no clones here: the contents are copied). per-entry copies
// each content with a read and a write of its own (the way before copyContentsBulk), bulk in
// runs of neighbours. Each round builds the two checkpoints anew (untimed).
func BenchmarkDeleteFull(b *testing.B) {
	for _, mode := range []struct {
		name string
		size int
		bulk bool
	}{{"16B/per-entry", 16, false}, {"16B/bulk", 16, true}, {"4KiB/per-entry", 4096, false}, {"4KiB/bulk", 4096, true}} {
		b.Run(mode.name, func(b *testing.B) {
			defer func(v bool) { bulkCopy = v }(bulkCopy)
			bulkCopy = mode.bulk
			var lat latencies
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				f := newFixture(b, nil)
				paths := benchTree(b, f, 5000)
				if mode.size != 4096 {
					for _, p := range paths {
						must(b, os.WriteFile(f.m(p), make([]byte, mode.size), 0o644))
					}
				}
				f.capture(b, "c0", L2)
				modify(b, f, paths, 10, i+1)
				f.capture(b, "c1", L1)
				b.StartTimer()
				start := time.Now()
				must(b, f.s.Delete(context.Background(), "c0"))
				lat = append(lat, time.Since(start))
			}
			lat.report(b)
		})
	}
}
