package integration

import (
	"context"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// BenchmarkForkFromCheckpoint measures `fork --from CKPT --count 8` of a sandbox whose upper
// dir holds 5,000 files, 100 of them changed since the previous checkpoint (no processes: the
// checkpoint is written once as a shared read-only layer that the 8 new sandboxes stack above
// the image), against today's L3 fork (snapshot push + 8 restores) of the same sandbox in the
// same run. The source's pool keeps 8 sandboxes ready (waited for, untimed, before each
// call): fork-from takes them and moves each onto the layer (pool/reroot_linux.go);
// fork-from-cold is the same call with no ready sandbox (the pool scaled to 0: 8 new
// containers on the layer, the way every fork was made before). Per-fork times are the whole
// call divided by 8 for all three (fork-from, fork-from-cold, fork-l3); fork-from-ready is
// each warm fork's time from the call's start until it answered (its lease_ms: the layer's
// writing included).
func BenchmarkForkFromCheckpoint(b *testing.B) {
	const n = 8
	d := startDaemon(b)
	d.createPool("bb", busyboxImage, n, "--max", "64")
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && cd /w && for i in $(seq 1 5000); do echo file $i > f$i; done")
	d.cli("checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "cd /w && for i in $(seq 1 100); do echo changed $i > f$i; done")
	d.cli("state", "patch", id, `[{"op":"add","path":"/step","value":2}]`)
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id)
	c, ctx := d.client(), context.Background()
	var from, ready, cold, l3 samples
	release := func(ls []api.Lease) {
		for _, l := range ls {
			_ = c.Release(ctx, l.ID)
		}
	}
	fork := func(s *samples, req api.SnapshotRequest) []api.Lease {
		start := time.Now()
		ls, err := c.ForkWith(ctx, id, req, nil)
		if err != nil {
			b.Fatal(err)
		}
		*s = append(*s, time.Since(start)/n)
		return ls
	}
	rounds := max(b.N, 5)
	for i := 0; i < rounds; i++ {
		d.waitReady("bb", n, 2*time.Minute)
		ls := fork(&from, api.SnapshotRequest{Count: n, From: ck.ID})
		for _, l := range ls {
			ready = append(ready, msDur(l.LeaseMS))
		}
		release(ls)
	}
	// Each phase's figures are logged as it ends (-v), so that a later phase's failure keeps them.
	b.Logf("fork-from (ready sandboxes): p50 %.1f ms p99 %.1f ms per fork; ready p50 %.1f ms", ms(from.pct(0.5)), ms(from.pct(0.99)), ms(ready.pct(0.5)))
	d.cli("pool", "scale", "bb", "--min-ready", "0")
	testutil.WaitFor(b, 2*time.Minute, 20*time.Millisecond, "no ready sandbox", func() bool {
		p, err := c.Pool(ctx, "bb")
		return err == nil && p.Ready == 0 && p.Creating == 0
	})
	for i := 0; i < rounds; i++ {
		release(fork(&cold, api.SnapshotRequest{Count: n, From: ck.ID}))
	}
	b.Logf("fork-from-cold (new containers): p50 %.1f ms p99 %.1f ms per fork", ms(cold.pct(0.5)), ms(cold.pct(0.99)))
	for i := 0; i < max(1, b.N/2); i++ {
		release(fork(&l3, api.SnapshotRequest{Count: n}))
	}
	from.report(b, "fork-from")
	ready.report(b, "fork-from-ready")
	cold.report(b, "fork-from-cold")
	l3.report(b, "fork-l3")
	b.ReportMetric(float64(l3.pct(0.5))/float64(from.pct(0.5)), "l3/fork-from-x")
	b.ReportMetric(float64(cold.pct(0.5))/float64(from.pct(0.5)), "cold/fork-from-x")
}
