package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's Prometheus metrics; a nil *metrics records nothing.
type metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	commits   *prometheus.CounterVec
}

var latencyBuckets = []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deltabox_proxy_decisions_total", Help: "Proxy decisions by outcome.",
		}, []string{"decision"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "deltabox_proxy_request_duration_seconds", Help: "Time the proxy spent on a request, by decision.",
			Buckets: latencyBuckets,
		}, []string{"decision"}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deltabox_proxy_released_effects_total", Help: "Effects sent on commit or rollback, by final status.",
		}, []string{"status"}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.commits} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(decision string, d time.Duration) {
	if m != nil {
		m.decisions.WithLabelValues(decision).Inc()
		m.latency.WithLabelValues(decision).Observe(d.Seconds())
	}
}

func (m *metrics) connRefused() {
	if m != nil {
		m.decisions.WithLabelValues("connection_limit").Inc()
	}
}

func (m *metrics) effectDone(status Status) {
	if m != nil {
		m.commits.WithLabelValues(string(status)).Inc()
	}
}
