package meter

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the meter's series (docs/observability.md): what it charged,
// by tariff (a bounded label: the admins' tariffs).
type metrics struct {
	sandboxes *prometheus.CounterVec // tariff
	billed    *prometheus.CounterVec // tariff, kind (running, paused)
	cost      *prometheus.CounterVec // tariff
	stopped   prometheus.Counter
}

// RegisterMetrics registers the meter's series on reg. The counters grow
// as this replica charges ended sandboxes: with several replicas, sum
// them (each sandbox is charged by one).
func (m *Meter) RegisterMetrics(reg prometheus.Registerer) error {
	mm := &metrics{
		sandboxes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_usage_charged_sandboxes_total",
			Help: "Ended sandboxes charged to their team's ledger, by tariff.",
		}, []string{"tariff"}),
		billed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_usage_billed_seconds_total",
			Help: "Sandbox-seconds billed (rounded up per sandbox, the minimum applied to running time), by tariff and kind (running, paused).",
		}, []string{"tariff", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_usage_cost_total",
			Help: "Cost charged, in units of the tariffs' currency, by tariff.",
		}, []string{"tariff"}),
		stopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "evalbox_billing_stopped_sandboxes_total",
			Help: "Sandboxes stopped because their team's balance ran out (balance_exhausted).",
		}),
	}
	for _, c := range []prometheus.Collector{mm.sandboxes, mm.billed, mm.cost, mm.stopped} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.metrics = mm
	m.mu.Unlock()
	return nil
}

// charged counts a sandbox the meter charged.
func (mm *metrics) charged(tariff string, l Line) {
	if mm == nil {
		return
	}
	mm.sandboxes.WithLabelValues(tariff).Inc()
	mm.billed.WithLabelValues(tariff, "running").Add(l.Billed.Seconds())
	mm.billed.WithLabelValues(tariff, "paused").Add(l.BilledPaused.Seconds())
	mm.cost.WithLabelValues(tariff).Add(float64(l.Cost) / Nano)
}
