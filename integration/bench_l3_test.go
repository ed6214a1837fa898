package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// heapScript is a Python process holding ~50 MB of heap (random, so it does not compress).
const heapScript = `import os, time
heap = os.urandom(50 << 20)
n = 0
while True:
    n += 1
    time.sleep(0.1)`

// BenchmarkL3SnapshotRestore measures an L3 snapshot of a python process with ~50 MB of heap
// (frozen window, packaging, upload to the local object store) and its restore as a new
// sandbox, against `ctr c checkpoint --rw --task` + `ctr c restore --rw --live` of a container
// running the same process, in the same run. The same is done, alternating, in a pool without
// a user namespace (l3-restore-no-userns), where the restore is lazy when lazy_restore is on
// (criu.WithLazyPages; in a user-namespaced pool only when the host sets
// vm.unprivileged_userfaultfd = 1).
// DELTABOX_BENCH_LAZY=1 runs the daemon with lazy_restore = true (default false), and
// DELTABOX_BENCH_RESTORE_MEMORY=SIZE with restore_memory = SIZE ("0": restores stage on disk).
func BenchmarkL3SnapshotRestore(b *testing.B) {
	extra := "[snapshots]\n"
	if os.Getenv("DELTABOX_BENCH_LAZY") == "1" {
		extra += "lazy_restore = true\n"
	}
	if v := os.Getenv("DELTABOX_BENCH_RESTORE_MEMORY"); v != "" {
		extra += fmt.Sprintf("restore_memory = %q\n", v)
	}
	d := startDaemonWith(b, extra)
	d.createPool("py", pythonImage, 1, "--max", "64")
	d.createPool("pyh", pythonImage, 1, "--max", "64", "--no-userns")
	c, ctx := d.client(), context.Background()
	var frozen, pkg, upload, push, restore, restoreHost samples
	leaseHeap := func(pool string) string {
		id := d.lease(pool).ID
		d.cli("exec", id, "--", "sh", "-c", "nohup python3 -c '"+heapScript+"' >/dev/null 2>&1 & sleep 1")
		return id
	}
	id, host := leaseHeap("py"), leaseHeap("pyh")
	for i := 0; i < b.N; i++ {
		start := time.Now()
		snap, err := c.SnapshotPush(ctx, id, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		push = append(push, time.Since(start))
		frozen = append(frozen, msDur(snap.FrozenMS))
		pkg = append(pkg, msDur(snap.PackageMS))
		upload = append(upload, msDur(snap.UploadMS))
		start = time.Now()
		l, err := c.Restore(ctx, snap.URI, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		restore = append(restore, time.Since(start))
		_ = c.Release(ctx, l.ID)
		_ = c.SnapshotRemove(ctx, snap.URI)

		snap, err = c.SnapshotPush(ctx, host, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		l, err = c.Restore(ctx, snap.URI, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		restoreHost = append(restoreHost, time.Since(start))
		_ = c.Release(ctx, l.ID)
		_ = c.SnapshotRemove(ctx, snap.URI)
	}
	base := ctrBaseline(b, d.env, pythonImage, []string{"python3", "-c", heapScript}, "", max(3, b.N/2))
	frozen.report(b, "l3-frozen")
	pkg.report(b, "l3-package")
	upload.report(b, "l3-upload")
	push.report(b, "l3-push")
	restore.report(b, "l3-restore")
	restoreHost.report(b, "l3-restore-no-userns")
	base.report(b, "ctr-ckpt+restore")
	both := push.pct(0.5) + restore.pct(0.5)
	b.ReportMetric(float64(base.pct(0.5))/float64(both), "ctr/(push+restore)-x")
}

func msDur(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
