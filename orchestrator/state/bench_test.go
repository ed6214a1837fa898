package state

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// benchDir is where benchmark stores live: $DELTABOX_BENCH_DIR (to measure a particular
// disk), else a temp dir. fsync costs depend on it; tmpfs makes them free.
func benchDir(b *testing.B) string {
	if d := os.Getenv("DELTABOX_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "state-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

// reportPercentiles reports the p50 and p99 of per-iteration durations in milliseconds.
func reportPercentiles(b *testing.B, durs []time.Duration) {
	if len(durs) == 0 {
		return
	}
	slices.Sort(durs)
	at := func(p int) float64 {
		i := min(len(durs)-1, len(durs)*p/100)
		return float64(durs[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(50), "p50-ms")
	b.ReportMetric(at(99), "p99-ms")
}

// BenchmarkPatchDurable is one single-op patch (an append of a small message), fsynced before
// it returns. Target: p50 <= 1 ms.
func BenchmarkPatchDurable(b *testing.B) {
	s := openStore(b, benchDir(b))
	defer s.Close()
	ctx := context.Background()
	patch(b, s, `{"op":"add","path":"/msgs","value":[]}`)
	ops := mustOps(b, `{"op":"append","path":"/msgs","value":{"role":"tool","content":"exit 0","tokens":17}}`)
	var durs []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := s.Patch(ctx, ops, PatchOptions{Checkpoint: "ck"}); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(t0))
	}
	reportPercentiles(b, durs)
}

// BenchmarkPatchDurableParallel shows group commit: concurrent single-op patches share
// fsyncs. It reports fsyncs per patch.
func BenchmarkPatchDurableParallel(b *testing.B) {
	s := openStore(b, benchDir(b))
	defer s.Close()
	ctx := context.Background()
	patch(b, s, `{"op":"add","path":"/msgs","value":[]}`)
	ops := mustOps(b, `{"op":"append","path":"/msgs","value":{"role":"tool","content":"exit 0"}}`)
	syncs0, seq0 := s.commit.syncs.Load(), s.Seq()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Patch(ctx, ops, PatchOptions{}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if n := s.Seq() - seq0; n > 0 {
		b.ReportMetric(float64(s.commit.syncs.Load()-syncs0)/float64(n), "fsyncs/patch")
	}
}

// BenchmarkRollback1000 rolls back over 1,000 ops (ten 100-op patches of appends and
// replaces), durably. Target: p50 <= 5 ms.
func BenchmarkRollback1000(b *testing.B) {
	s := openStore(b, benchDir(b))
	defer s.Close()
	ctx := context.Background()
	patch(b, s, `[{"op":"add","path":"/msgs","value":[]},{"op":"add","path":"/plan","value":{"step":0}}]`)
	batch := make([]Op, 0, 100)
	for i := range 50 {
		batch = append(batch,
			mustOps(b, fmt.Sprintf(`{"op":"append","path":"/msgs","value":{"role":"assistant","content":"step %d"}}`, i))[0],
			mustOps(b, fmt.Sprintf(`{"op":"replace","path":"/plan/step","value":%d}`, i))[0])
	}
	var durs []time.Duration
	for b.Loop() {
		b.StopTimer()
		mark := s.Seq()
		for range 10 {
			if _, err := s.Patch(ctx, batch, PatchOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		n, err := s.RollbackTo(ctx, mark)
		durs = append(durs, time.Since(t0))
		if err != nil || n != 1000 {
			b.Fatalf("RollbackTo = %d, %v; want 1000 undone", n, err)
		}
	}
	reportPercentiles(b, durs)
}
