package integration

import (
	"context"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// BenchmarkForkFromCheckpoint measures `fork --from CKPT --count 8` (files and state written
// into warm sandboxes of the pool, no snapshot) of a sandbox whose upper dir holds 5,000 files,
// 100 of them changed since the previous checkpoint, against today's L3 fork (snapshot push +
// 8 restores) of the same sandbox in the same run. Per-fork times: each fork's own time for
// --from (lease_ms), the whole call divided by 8 for L3.
func BenchmarkForkFromCheckpoint(b *testing.B) {
	const n = 8
	d := startDaemon(b)
	d.createPool("bb", busyboxImage, n, "--max", "64", "--no-userns")
	id := d.lease("bb").ID
	d.waitReady("bb", n, 2*time.Minute)
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && cd /w && for i in $(seq 1 5000); do echo file $i > f$i; done")
	d.cli("checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "cd /w && for i in $(seq 1 100); do echo changed $i > f$i; done")
	d.cli("state", "patch", id, `[{"op":"add","path":"/step","value":2}]`)
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id)
	c, ctx := d.client(), context.Background()
	var from, l3 samples
	release := func(ls []api.Lease) {
		for _, l := range ls {
			_ = c.Release(ctx, l.ID)
		}
		d.waitReady("bb", n, 2*time.Minute)
	}
	for i := 0; i < b.N; i++ {
		ls, err := c.ForkWith(ctx, id, api.SnapshotRequest{Count: n, From: ck.ID}, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range ls {
			from = append(from, msDur(l.LeaseMS))
		}
		release(ls)
	}
	for i := 0; i < max(1, b.N/2); i++ {
		start := time.Now()
		ls, err := c.ForkWith(ctx, id, api.SnapshotRequest{Count: n}, nil)
		if err != nil {
			b.Fatal(err)
		}
		l3 = append(l3, time.Since(start)/n)
		release(ls)
	}
	from.report(b, "fork-from")
	l3.report(b, "fork-l3")
	b.ReportMetric(float64(l3.pct(0.5))/float64(from.pct(0.5)), "l3/fork-from-x")
}
