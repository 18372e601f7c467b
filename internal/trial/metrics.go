package trial

import (
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts the trials of the Runners it is given to (Runner.Metrics),
// by source (what ran them: Runner.Source) and status (docs/observability.md).
// One Metrics serves every Runner of a server.
type Metrics struct {
	trials   *prometheus.CounterVec   // source, status
	attempts *prometheus.CounterVec   // source
	duration *prometheus.HistogramVec // source
}

// NewMetrics returns the trial metrics, registered on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		trials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_trials_total",
			Help: "Trials (one script in a fresh sandbox) that ended, by source (eval, execute: /v1/execute and SandboxFusion) and status (exited, timed_out, killed, or error: every attempt failed on infrastructure).",
		}, []string{"source", "status"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_trial_attempts_total",
			Help: "Attempts trials took, by source; more than evalbox_trials_total means retries after infrastructure failures.",
		}, []string{"source"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "evalbox_trial_duration_seconds",
			Help:    "Time a trial took, every attempt and backoff included, by source.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900},
		}, []string{"source"}),
	}
	for _, c := range []prometheus.Collector{m.trials, m.attempts, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe counts one trial's outcome.
func (m *Metrics) observe(source string, out Outcome) {
	if m == nil {
		return
	}
	status := out.Result.Status
	switch status {
	case client.StatusExited, client.StatusTimedOut, client.StatusKilled, client.StatusError:
	default:
		status = "other"
	}
	m.trials.WithLabelValues(source, status).Inc()
	m.attempts.WithLabelValues(source).Add(float64(out.Attempts))
	m.duration.WithLabelValues(source).Observe(out.Duration.Seconds())
}
