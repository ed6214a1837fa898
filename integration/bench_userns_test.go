package integration

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// BenchmarkUserNamespaceCost measures what a user namespace costs, against a pool without one
// (--no-userns, the isolation before user namespaces) on the same daemon, interleaved in the
// same run: a warm lease, an exec of `true`, an L1 checkpoint of 10 changed 4 KiB files in a
// 5,000-file upper dir and the rollback of that step, and sandbox creation (the pools' refills,
// from the daemon's "sandbox created" lines). Which pool goes first alternates per iteration.
func BenchmarkUserNamespaceCost(b *testing.B) {
	d := startDaemon(b)
	kinds := []struct{ pool, metric string }{{"userns", "userns"}, {"host", "no-userns"}}
	d.createPool("userns", busyboxImage, 4, "--max", "1000")
	d.createPool("host", busyboxImage, 4, "--max", "1000", "--no-userns")
	c, ctx := d.client(), context.Background()
	const tree = `mkdir -p /t && cd /t && for d in $(seq 1 50); do mkdir $d; for f in $(seq 1 100); do echo $d$f > $d/$f; done; done`
	step := `for i in $(seq 1 10); do head -c 4096 /dev/urandom > /t/$i/step; done`
	type box struct {
		id                       string
		first                    string
		lease, exec, ckpt, rback samples
	}
	boxes := make([]*box, len(kinds))
	for k, kind := range kinds {
		l := d.lease(kind.pool)
		d.cli("exec", l.ID, "--timeout", "5m", "--", "sh", "-c", tree)
		var first api.Checkpoint
		d.cliJSON(&first, "checkpoint", "create", l.ID)
		boxes[k] = &box{id: l.ID, first: first.ID}
	}
	for i := 0; i < b.N; i++ {
		for j := range kinds {
			k := (i + j) % len(kinds) // alternate which pool goes first
			kind, bx := kinds[k], boxes[k]
			var l api.Lease
			timed(&bx.lease, func() {
				var err error
				if l, err = c.Lease(ctx, kind.pool, api.LeaseRequest{}); err != nil {
					b.Fatalf("lease %s: %v", kind.pool, err)
				}
			})
			if err := c.Release(ctx, l.ID); err != nil {
				b.Fatal(err)
			}
			timed(&bx.exec, func() {
				if st, err := c.Exec(ctx, bx.id, api.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err != nil || st.Code != 0 {
					b.Fatalf("exec: %v %+v", err, st)
				}
			})
			if i%10 == 9 {
				if _, err := c.Rollback(ctx, bx.id, api.RollbackRequest{To: bx.first}); err != nil {
					b.Fatal(err)
				}
			}
			d.cli("exec", bx.id, "--", "sh", "-c", step)
			var ck api.Checkpoint
			timed(&bx.ckpt, func() {
				var err error
				if ck, err = c.Checkpoint(ctx, bx.id, api.CheckpointRequest{}); err != nil {
					b.Fatal(err)
				}
			})
			d.cli("exec", bx.id, "--", "sh", "-c", step)
			timed(&bx.rback, func() {
				if _, err := c.Rollback(ctx, bx.id, api.RollbackRequest{To: ck.ID}); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
	d.waitReady("userns", 4, time.Minute)
	d.waitReady("host", 4, time.Minute)
	for k, kind := range kinds {
		bx := boxes[k]
		bx.lease.report(b, "lease-"+kind.metric)
		bx.exec.report(b, "exec-"+kind.metric)
		bx.ckpt.report(b, "ckpt-l1-"+kind.metric)
		bx.rback.report(b, "rollback-"+kind.metric)
		createTimes(d, kind.pool).report(b, "create-"+kind.metric)
	}
	ratio := func(name string, a, z samples) {
		b.ReportMetric(float64(a.pct(0.5))/float64(z.pct(0.5)), name+"-userns/no-userns")
	}
	u, h := boxes[0], boxes[1]
	ratio("lease", u.lease, h.lease)
	ratio("exec", u.exec, h.exec)
	ratio("ckpt-l1", u.ckpt, h.ckpt)
	ratio("rollback", u.rback, h.rback)
	ratio("create", createTimes(d, "userns"), createTimes(d, "host"))
}

// createTimes reads the creation times of pool's sandboxes from the daemon's log.
func createTimes(d *daemon, pool string) samples {
	re := regexp.MustCompile(`msg="sandbox created" pool=` + regexp.QuoteMeta(pool) + ` container=\S+ ms=(\d+)`)
	var s samples
	for _, m := range re.FindAllStringSubmatch(d.logs.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		s = append(s, time.Duration(n)*time.Millisecond)
	}
	return s
}
