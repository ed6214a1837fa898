package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// samples collects per-operation latencies and reports their percentiles.
type samples []time.Duration

func (s samples) pct(p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := append(samples(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	return c[min(len(c)-1, int(p*float64(len(c))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (s samples) report(b *testing.B, name string) {
	b.ReportMetric(ms(s.pct(0.50)), name+"-p50-ms")
	b.ReportMetric(ms(s.pct(0.99)), name+"-p99-ms")
}

func timed(s *samples, fn func()) {
	start := time.Now()
	fn()
	*s = append(*s, time.Since(start))
}

func ctr(e env, args ...string) error {
	out, err := exec.Command("ctr", append([]string{"--address", e.containerd, "-n", "deltabox"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// BenchmarkLeaseVsCtrRun measures a warm lease through the API and through the CLI against a
// cold `ctr run --rm` of the same image, interleaved in the same run. The API and CLI leases
// come in pairs, in alternating order, so that both meet the same host: every lease starts a
// refill (a container created, 100+ ms of host CPU) that slows what comes right after it. A
// cold run lets the pool's refill run during it, so the pool is refilled after each before
// the next pair: that refill would otherwise fall on one of the pair only (the benchmark
// once placed its CLI leases right after the cold runs, and measured that refill more than
// the CLI).
func BenchmarkLeaseVsCtrRun(b *testing.B) {
	d := startDaemon(b)
	d.createPool("bench", busyboxImage, 20, "--max", "1000")
	c, ctx := d.client(), context.Background()
	var api_, cli, cold, start samples
	var held []string
	cliLease := func() {
		timed(&cli, func() { held = append(held, strings.TrimSpace(d.cli("lease", "--pool", "bench"))) })
	}
	apiLease := func() {
		timed(&api_, func() {
			l, err := c.Lease(ctx, "bench", api.LeaseRequest{})
			if err != nil || l.Cold {
				b.Fatalf("lease: %v (cold %v)", err, l.Cold)
			}
			held = append(held, l.ID)
		})
	}
	for i := 0; i < b.N; i++ {
		if len(held) >= 14 {
			for _, id := range held {
				c.Release(ctx, id)
			}
			held = held[:0]
			d.waitReady("bench", 20, time.Minute)
		}
		// The floor the CLI stands on, on this host: starting it, no request (a static Go
		// binary's start costs 1-10 ms depending on the machine's page fault cost).
		timed(&start, func() {
			if _, errOut, code := runCLI(d.env.bin, "--version"); code != 0 {
				b.Fatalf("deltabox --version: %s", errOut)
			}
		})
		if i%2 == 0 {
			cliLease()
			apiLease()
		} else {
			apiLease()
			cliLease()
		}
		if i%4 == 3 {
			timed(&cold, func() {
				if err := ctr(d.env, "run", "--rm", busyboxImage, fmt.Sprintf("bench-run-%d", i), "true"); err != nil {
					b.Fatal(err)
				}
			})
			d.waitReady("bench", 20, time.Minute)
		}
	}
	api_.report(b, "lease-api")
	cli.report(b, "lease-cli")
	start.report(b, "cli-start")
	cold.report(b, "ctr-run")
	b.ReportMetric(float64(cold.pct(0.5))/float64(api_.pct(0.5)), "ctr-run/lease-x")
}

// BenchmarkExecVsCtrExec measures `true` through the API (init socket) against `ctr task exec`
// on the same sandbox's container.
func BenchmarkExecVsCtrExec(b *testing.B) {
	d := startDaemon(b)
	d.createPool("bench", busyboxImage, 1)
	l := d.lease("bench")
	c, ctx := d.client(), context.Background()
	var viaAPI, viaCLI, viaCtr samples
	for i := 0; i < b.N; i++ {
		timed(&viaAPI, func() {
			st, err := c.Exec(ctx, l.ID, api.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
			if err != nil || st.Code != 0 {
				b.Fatalf("exec: %v %+v", err, st)
			}
		})
		if i%4 == 0 {
			timed(&viaCLI, func() { d.cli("exec", l.ID, "--", "true") })
			timed(&viaCtr, func() {
				if err := ctr(d.env, "task", "exec", "--exec-id", "b"+strconv.Itoa(i), l.Container, "true"); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
	viaAPI.report(b, "exec-api")
	viaCLI.report(b, "exec-cli")
	viaCtr.report(b, "ctr-exec")
	b.ReportMetric(float64(viaCtr.pct(0.5))/float64(viaAPI.pct(0.5)), "ctr-exec/exec-x")
}

// BenchmarkRefill leases 10 sandboxes from a pool with min_ready 10 and times its return to 10.
func BenchmarkRefill(b *testing.B) {
	d := startDaemon(b)
	d.createPool("refill", busyboxImage, 10, "--max", "1000")
	c, ctx := d.client(), context.Background()
	var refill samples
	for i := 0; i < b.N; i++ {
		for range 10 {
			if _, err := c.Lease(ctx, "refill", api.LeaseRequest{}); err != nil {
				b.Fatal(err)
			}
		}
		timed(&refill, func() { d.waitReady("refill", 10, time.Minute) })
	}
	refill.report(b, "refill10")
}

// BenchmarkDensity keeps 100 warm busybox sandboxes and reports the memory each costs (shim,
// runc leftovers and init included, from MemAvailable) and the lease latency at that size.
func BenchmarkDensity(b *testing.B) {
	d := startDaemon(b)
	before := memAvailable(b)
	start := time.Now()
	d.createPool("dense", busyboxImage, 100, "--max", "400")
	b.ReportMetric(time.Since(start).Seconds(), "fill100-s")
	time.Sleep(2 * time.Second)
	b.ReportMetric(float64(before-memAvailable(b))/100/(1<<20), "MiB/sandbox")
	c, ctx := d.client(), context.Background()
	var lease samples
	for i := 0; i < max(b.N, 50); i++ {
		timed(&lease, func() {
			if _, err := c.Lease(ctx, "dense", api.LeaseRequest{}); err != nil {
				b.Fatal(err)
			}
		})
	}
	lease.report(b, "lease100")
}

func memAvailable(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// BenchmarkCheckpointRollback measures an L1 checkpoint of 10 changed 4 KiB files in an upper
// dir of 5,000 files and the rollback of that step, through the API, against
// `ctr c checkpoint --rw --task` + `ctr c restore --rw --live` of a container of the same image
// with the same 5,000-file upper dir, in the same run.
func BenchmarkCheckpointRollback(b *testing.B) {
	d := startDaemon(b)
	d.createPool("bench", busyboxImage, 1)
	l := d.lease("bench")
	c, ctx := d.client(), context.Background()
	const tree = `mkdir -p /t && cd /t && for d in $(seq 1 50); do mkdir $d; for f in $(seq 1 100); do echo $d$f > $d/$f; done; done`
	d.cli("exec", l.ID, "--timeout", "5m", "--", "sh", "-c", tree)
	step := `for i in $(seq 1 10); do head -c 4096 /dev/urandom > /t/$i/step; done`
	var ckpt, frozen, rb, rbFrozen samples
	var first api.Checkpoint
	d.cliJSON(&first, "checkpoint", "create", l.ID)
	for i := 0; i < b.N; i++ {
		if i%10 == 9 { // a task of ten steps ends: keep the chain that short (untimed)
			if _, err := c.Rollback(ctx, l.ID, api.RollbackRequest{To: first.ID}); err != nil {
				b.Fatal(err)
			}
		}
		d.cli("exec", l.ID, "--", "sh", "-c", step)
		start := time.Now()
		ck, err := c.Checkpoint(ctx, l.ID, api.CheckpointRequest{})
		if err != nil {
			b.Fatal(err)
		}
		ckpt = append(ckpt, time.Since(start))
		frozen = append(frozen, time.Duration(ck.FrozenMS*float64(time.Millisecond)))
		d.cli("exec", l.ID, "--", "sh", "-c", step)
		start = time.Now()
		res, err := c.Rollback(ctx, l.ID, api.RollbackRequest{To: ck.ID})
		if err != nil {
			b.Fatal(err)
		}
		rb = append(rb, time.Since(start))
		rbFrozen = append(rbFrozen, time.Duration(res.FrozenMS*float64(time.Millisecond)))
	}
	ckpt.report(b, "ckpt-l1")
	frozen.report(b, "ckpt-frozen")
	rb.report(b, "rollback")
	rbFrozen.report(b, "rollback-frozen")
	if os.Getenv("DELTABOX_BENCH_NO_L3") == "1" { // focused runs: no CRIU baseline
		return
	}
	base := ctrCheckpointRestore(b, d.env, tree, max(3, b.N/20))
	base.report(b, "ctr-ckpt+restore")
	b.ReportMetric(float64(base.pct(0.5))/float64(rb.pct(0.5)), "ctr/rollback-x")
}

// ctrCheckpointRestore times `ctr c checkpoint --rw --task` + `ctr c restore --rw --live` of a
// busybox container holding the same tree.
func ctrCheckpointRestore(b *testing.B, e env, tree string, n int) samples {
	return ctrBaseline(b, e, busyboxImage, []string{"sleep", "100000"}, tree, n)
}

// ctrBaseline starts image with cmd through ctr, runs setup in it, then times n rounds of
// `ctr c checkpoint --rw --task` + `ctr c restore --rw --live` (the old task and container are
// force-deleted in between, as restore needs).
func ctrBaseline(b *testing.B, e env, image string, cmd []string, setup string, n int) samples {
	id := fmt.Sprintf("bench-ctr-%d", time.Now().UnixNano())
	if err := ctr(e, append([]string{"run", "-d", image, id}, cmd...)...); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = ctr(e, "task", "delete", "-f", id)
		_ = ctr(e, "container", "delete", id)
	}()
	if setup != "" {
		if err := ctr(e, "task", "exec", "--exec-id", "setup", id, "sh", "-c", setup); err != nil {
			b.Fatal(err)
		}
	}
	var out samples
	for i := 0; i < n; i++ {
		ref := fmt.Sprintf("deltabox.local/bench-ckpt:%d", i)
		timed(&out, func() {
			if err := ctr(e, "container", "checkpoint", "--rw", "--task", id, ref); err != nil {
				b.Fatal(err)
			}
			_ = ctr(e, "task", "delete", "-f", id)
			_ = ctr(e, "container", "delete", id)
			if err := ctr(e, "container", "restore", "--rw", "--live", id, ref); err != nil {
				b.Fatal(err)
			}
		})
		_ = ctr(e, "image", "rm", ref)
	}
	return out
}
