//go:build linux

package criu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
)

// heapScript keeps a counter next to 50 MiB of random heap (the worst case for compression).
// Like counterScript, it overwrites /tmp/count in place with a fixed-width number: the file
// keeps its size, which CRIU checks at restore for the file the process has open. open("w")
// truncated it first, and a dump that fell between the truncate and the write failed the
// restore ("File tmp/count has bad size 1 (expect 0)").
const heapScript = `import os, time
heap = os.urandom(50 << 20)
fd = os.open("/tmp/count", os.O_WRONLY | os.O_CREAT, 0o644)
i = 0
while True:
    i += 1
    os.pwrite(fd, b"%011d\n" % i, 0)
    time.sleep(0.05)
`

// newHeapSandbox starts a python sandbox holding 50 MiB of heap and waits until it counts.
func (e *env) newHeapSandbox(t testing.TB) *sandbox {
	t.Helper()
	sb := e.newSandbox(t, pythonImage, "exec python3 "+runPath+"/heap.py", Options{TCPEstablished: true}, withRunFile("heap.py", heapScript))
	sb.waitCount(t, "python heap counter", func(n int) bool { return n > 2 })
	return sb
}

// cycle is one dump + pack + kill + in-place restore of a sandbox.
type cycle struct {
	dump, frozen, pack, restore time.Duration
	stats                       DumpStats
	size, packed                int64
}

func (e *env) dumpRestoreCycle(t testing.TB, sb *sandbox) cycle {
	t.Helper()
	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	res, err := e.cp.Dump(e.ctx, sb.id, images)
	if err != nil {
		t.Fatal(err)
	}
	c := cycle{dump: res.Duration, frozen: res.Stats.Frozen, stats: res.Stats, size: res.Size}
	f, err := os.Create(filepath.Join(dir, "images.tar.zst"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := Pack(e.ctx, images, f); err != nil {
		t.Fatal(err)
	}
	c.pack = time.Since(start)
	if info, err := f.Stat(); err == nil {
		c.packed = info.Size()
	}
	f.Close()
	dumped := sb.count()
	e.kill(t, sb)
	c.restore = e.restore(t, sb, images)
	sb.waitCount(t, "restored counter", func(n int) bool { return n > 0 && n <= dumped+10 })
	os.RemoveAll(dir)
	return c
}

// TestPythonHeapTimings measures one dump/pack/restore cycle of a python process with 50 MiB
// of heap and logs the figures (see also BenchmarkDumpRestore).
func TestPythonHeapTimings(t *testing.T) {
	e := newEnv(t)
	sb := e.newHeapSandbox(t)
	c := e.dumpRestoreCycle(t, sb)
	t.Logf("dump %s (CRIU: freezing %s, frozen %s, memdump %s, memwrite %s, %d pages written), images %d B, pack %s -> %d B, restore %s",
		c.dump, c.stats.Freezing, c.stats.Frozen, c.stats.MemDump, c.stats.MemWrite, c.stats.PagesWritten, c.size, c.pack, c.packed, c.restore)
	if c.size < 50<<20 {
		t.Fatalf("images hold %d bytes, want the 50 MiB heap in them", c.size)
	}
}

// BenchmarkDumpRestore compares, on the same python sandbox with 50 MiB of heap, this
// package's dump (task left running, images to a directory) + in-place restore against
// `ctr c checkpoint --rw --task` + `ctr c restore --rw --live` (tar + gzip through the content
// store), reporting p50/p99 in milliseconds.
func BenchmarkDumpRestore(b *testing.B) {
	e := newEnv(b)
	ctrBin := os.Getenv("CTR")
	if ctrBin == "" {
		ctrBin = "ctr"
	}
	sb := e.newHeapSandbox(b)
	var dump, frozen, pack, restore, ctrCk, ctrRs []time.Duration
	for i := 0; i < b.N; i++ {
		c := e.dumpRestoreCycle(b, sb)
		dump, frozen, pack, restore = append(dump, c.dump), append(frozen, c.frozen), append(pack, c.pack), append(restore, c.restore)
		ck, rs := e.ctrCycle(b, ctrBin, sb, i)
		ctrCk, ctrRs = append(ctrCk, ck), append(ctrRs, rs)
	}
	report(b, "dump", dump)
	report(b, "frozen", frozen)
	report(b, "pack", pack)
	report(b, "restore", restore)
	report(b, "ctr-checkpoint", ctrCk)
	report(b, "ctr-restore", ctrRs)
}

// ctrCycle checkpoints sb with ctr into the content store, deletes the container, restores it
// under the same ID with ctr and reloads it.
func (e *env) ctrCycle(b *testing.B, ctrBin string, sb *sandbox, i int) (ck, rs time.Duration) {
	b.Helper()
	ref := fmt.Sprintf("deltabox.local/%s-checkpoint:%d", sb.id, i)
	ck = runTimed(b, ctrBin, "c", "checkpoint", "--rw", "--task", sb.id, ref)
	b.Cleanup(func() {
		exec.Command(ctrBin, "-a", os.Getenv("DELTABOX_CONTAINERD_ADDRESS"), "-n", testNamespace, "i", "rm", ref).Run()
	})
	dumped := sb.count()
	e.kill(b, sb)
	if err := sb.ctr.Delete(e.ctx, containerd.WithSnapshotCleanup); err != nil {
		b.Fatal(err)
	}
	rs = runTimed(b, ctrBin, "c", "restore", "--rw", "--live", sb.id, ref)
	ctr, err := e.client.LoadContainer(e.ctx, sb.id)
	if err != nil {
		b.Fatal(err)
	}
	if sb.task, err = ctr.Task(e.ctx, nil); err != nil {
		b.Fatal(err)
	}
	sb.ctr = ctr
	sb.waitCount(b, "ctr-restored counter", func(n int) bool { return n > 0 && n <= dumped+10 })
	return ck, rs
}

func runTimed(b *testing.B, bin string, args ...string) time.Duration {
	b.Helper()
	args = append([]string{"-a", os.Getenv("DELTABOX_CONTAINERD_ADDRESS"), "-n", testNamespace}, args...)
	start := time.Now()
	out, err := exec.Command(bin, args...).CombinedOutput()
	took := time.Since(start)
	if err != nil {
		b.Fatalf("%s %s: %v: %s", bin, strings.Join(args, " "), err, out)
	}
	return took
}

func report(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(ds[len(ds)/2]), name+"-p50-ms")
	b.ReportMetric(ms(ds[(len(ds)*99)/100]), name+"-p99-ms")
}

// withRunFile writes a file into the sandbox's host run directory while its spec is built
// (the run dir mount is already in the spec then).
func withRunFile(name, content string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		for _, m := range s.Mounts {
			if m.Destination == runPath {
				return os.WriteFile(filepath.Join(m.Source, name), []byte(content), 0o644)
			}
		}
		return fmt.Errorf("no %s mount in the spec", runPath)
	}
}
