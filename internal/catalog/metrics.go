package catalog

import (
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
)

// The catalog's metrics (docs/observability.md): how long builds and
// imports run and queue. Labels: the build's kind and final state.
type metrics struct {
	duration *prometheus.HistogramVec // kind, state
	queued   *prometheus.HistogramVec // kind
}

func newMetrics() *metrics {
	buckets := []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600}
	return &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "evalbox_template_build_duration_seconds",
			Help:    "Time a template build or import ran (from its start to its end), by kind and final state (succeeded, failed).",
			Buckets: buckets,
		}, []string{"kind", "state"}),
		queued: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "evalbox_template_build_queue_seconds",
			Help:    "Time a template build or import waited for a build slot (the team's, then the server's) before it started, by kind.",
			Buckets: append([]float64{.01, .1}, buckets...),
		}, []string{"kind"}),
	}
}

// RegisterMetrics puts the catalog's metrics on reg.
func (s *Service) RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{s.m.duration, s.m.queued} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// observeBuild counts a build that ended (b as last recorded).
func (s *Service) observeBuild(b *client.TemplateBuild) {
	kind := b.Kind
	switch kind {
	case client.BuildKindBuild, client.BuildKindImport:
	default:
		kind = "other"
	}
	if b.StartedAt == nil {
		return // it never started (the server shut down first)
	}
	s.m.queued.WithLabelValues(kind).Observe(b.StartedAt.Sub(b.CreatedAt).Seconds())
	end := time.Now()
	if b.FinishedAt != nil {
		end = *b.FinishedAt
	}
	switch b.State {
	case client.BuildStateSucceeded, client.BuildStateFailed:
		s.m.duration.WithLabelValues(kind, b.State).Observe(end.Sub(*b.StartedAt).Seconds())
	}
}
