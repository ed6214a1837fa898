package initproto_test

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/deltabox/deltabox/pool/initproto"
)

// BenchmarkExecTrue measures one exec of `true` through the client and the real init:
// connect, request, fork/exec, exit frame.
func BenchmarkExecTrue(b *testing.B) {
	p := startInit(b)
	ctx := context.Background()
	req := initproto.ExecRequest{Argv: []string{"/bin/true"}}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		st, err := p.client.Exec(ctx, req, nil, nil, nil)
		if err != nil || st.Code != 0 {
			b.Fatalf("exec true: %+v %v", st, err)
		}
		lat = append(lat, time.Since(start))
	}
	reportPercentiles(b, lat)
}

// BenchmarkBaselineOSExecTrue is the floor for BenchmarkExecTrue: the same binary run by
// os/exec in the benchmark process itself (fork, exec, wait), with no init in between.
func BenchmarkBaselineOSExecTrue(b *testing.B) {
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	reportPercentiles(b, lat)
}

// BenchmarkPing measures the protocol round trip alone.
func BenchmarkPing(b *testing.B) {
	p := startInit(b)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if _, err := p.client.Ping(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
