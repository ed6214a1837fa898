package pool

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the pool's Prometheus metrics; a nil *metrics records nothing.
type metrics struct {
	lease *prometheus.HistogramVec
	cold  *prometheus.CounterVec
	exec  prometheus.Histogram
}

var latencyBuckets = []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

func newMetrics(m *Manager, reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	mt := &metrics{
		lease: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "deltabox_lease_duration_seconds", Help: "Time to lease a sandbox.", Buckets: latencyBuckets,
		}, []string{"pool", "cold"}),
		cold: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deltabox_cold_leases_total", Help: "Leases that had to create a sandbox.",
		}, []string{"pool"}),
		exec: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "deltabox_exec_duration_seconds", Help: "Round trip of an exec through the sandbox init.", Buckets: latencyBuckets,
		}),
	}
	for _, c := range []prometheus.Collector{mt.lease, mt.cold, mt.exec, &poolCollector{m: m}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return mt, nil
}

func (mt *metrics) observeLease(pool string, cold bool, d time.Duration) {
	if mt == nil {
		return
	}
	c := "false"
	if cold {
		c = "true"
		mt.cold.WithLabelValues(pool).Inc()
	}
	mt.lease.WithLabelValues(pool, c).Observe(d.Seconds())
}

func (mt *metrics) observeExec(d time.Duration) {
	if mt != nil {
		mt.exec.Observe(d.Seconds())
	}
}

// poolCollector reports ready and leased sandboxes per pool at scrape time.
type poolCollector struct{ m *Manager }

var (
	readyDesc  = prometheus.NewDesc("deltabox_pool_ready", "Ready sandboxes in the pool.", []string{"pool"}, nil)
	leasedDesc = prometheus.NewDesc("deltabox_pool_leased", "Leased sandboxes of the pool.", []string{"pool"}, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- readyDesc; ch <- leasedDesc }

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.m.Pools() {
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, float64(p.Ready), p.Name)
		ch <- prometheus.MustNewConstMetric(leasedDesc, prometheus.GaugeValue, float64(p.Leased), p.Name)
	}
}
