package network

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkSetupTeardown measures one sandbox's network lifecycle as the pool's background
// filler sees it: Setup (netns + CNI ADD) then Teardown (CNI DEL + netns removal).
func BenchmarkSetupTeardown(b *testing.B) {
	m := newRootManager(b, testSubnet)
	ctx := context.Background()
	setups := make([]time.Duration, 0, b.N)
	teardowns := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		if _, err := m.Setup(ctx, id); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
		setups = append(setups, t1.Sub(t0))
		teardowns = append(teardowns, time.Since(t1))
	}
	reportPercentiles(b, "setup", setups)
	reportPercentiles(b, "teardown", teardowns)
}

func reportPercentiles(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(p float64) float64 {
		return float64(ds[int(p*float64(len(ds)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.50), name+"-p50-ms")
	b.ReportMetric(at(0.99), name+"-p99-ms")
}

// BenchmarkEnsure measures a steady-state Ensure (nothing to repair), the cost of calling it
// periodically.
func BenchmarkEnsure(b *testing.B) {
	m := newRootManager(b, testSubnet)
	for b.Loop() {
		if err := m.Ensure(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
