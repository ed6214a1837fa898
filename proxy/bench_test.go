package proxy

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// latencies collects per-operation durations and reports their percentiles in ms.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	pct := func(p int) float64 { return float64(l[(len(l)-1)*p/100].Microseconds()) / 1000 }
	b.ReportMetric(pct(50), "p50_ms")
	b.ReportMetric(pct(99), "p99_ms")
}

func timedGET(b *testing.B, c *http.Client, url string, want int) time.Duration {
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return time.Since(start)
}

func benchGET(b *testing.B, c *http.Client, url string) {
	timedGET(b, c, url, 200) // warm the connections
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		lat = append(lat, timedGET(b, c, url, 200))
	}
	b.StopTimer()
	lat.report(b)
}

// BenchmarkDirectGET is the baseline of BenchmarkPassGET: the same upstream without the proxy.
func BenchmarkDirectGET(b *testing.B) {
	up := newUpstream(b, false)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	benchGET(b, c, up.URL+"/bench")
}

// BenchmarkPassGET is a passed GET through the proxy (plain HTTP, keep-alive both sides).
func BenchmarkPassGET(b *testing.B) {
	up := newUpstream(b, false)
	e := newEnv(b)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	benchGET(b, e.client(2), up.URL+"/bench")
}

// BenchmarkPassGETIntercepted is a passed GET through a CONNECT tunnel with TLS interception
// on a kept-alive connection, against a TLS upstream.
func BenchmarkPassGETIntercepted(b *testing.B) {
	up := newUpstream(b, true)
	e := newEnv(b, WithUpstreamRootsPEM(up.certPEM()))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	benchGET(b, e.client(2), up.URL+"/bench")
}

func timedHold(b *testing.B, c *http.Client, url string) time.Duration {
	start := time.Now()
	resp, err := c.Post(url, "application/json", strings.NewReader(`{"n": 1}`))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return time.Since(start)
}

// BenchmarkHold is a held POST: journaled with fsync before the sandbox gets its answer.
func BenchmarkHold(b *testing.B) {
	up := newUpstream(b, false)
	e := newEnv(b)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	timedHold(b, c, up.URL+"/warm")
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		lat = append(lat, timedHold(b, c, up.URL+"/hold"))
	}
	b.StopTimer()
	lat.report(b)
}

// BenchmarkCommit100 commits 100 held effects to a local upstream.
func BenchmarkCommit100(b *testing.B) {
	up := newUpstream(b, false)
	e := newEnv(b)
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	c := e.client(2)
	lat := make(latencies, 0, b.N)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for k := 0; k < 100; k++ {
			timedHold(b, c, up.URL+"/commit")
		}
		b.StartTimer()
		start := time.Now()
		res, err := e.p.Commit(e.ctx, "sb-a")
		if err != nil || res.Released != 100 {
			b.Fatalf("commit %+v %v", res, err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	lat.report(b)
}
