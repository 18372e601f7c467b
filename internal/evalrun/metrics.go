package evalrun

import (
	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
)

// The eval runs' metrics (docs/observability.md): verdicts as they are
// recorded, by status, and runs as they end, by state.
type metrics struct {
	verdicts *prometheus.CounterVec // status
	runs     *prometheus.CounterVec // state
}

func newMetrics() *metrics {
	return &metrics{
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_eval_verdicts_total",
			Help: "Verdicts of eval samples this replica recorded, by status (passed, failed, timed_out, infra_error, or a judged program's wrong_answer, compile_error, ...).",
		}, []string{"status"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_eval_runs_finished_total",
			Help: "Eval runs that ended, by state (succeeded, failed, cancelled).",
		}, []string{"state"}),
	}
}

// RegisterMetrics puts the runs' metrics on reg; trials, when set, counts
// the trials of the runs (source "eval").
func (s *Service) RegisterMetrics(reg prometheus.Registerer, trials *trial.Metrics) error {
	for _, c := range []prometheus.Collector{s.m.verdicts, s.m.runs} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	s.trials.Metrics, s.trials.Source = trials, "eval"
	return nil
}

// statusLabels are the verdicts' statuses a label may have: the judges'
// own words (internal/eval's, a judged program's), never anything else,
// so that the label's values stay a fixed few.
var statusLabels = map[string]bool{
	string(eval.Passed): true, string(eval.Failed): true, string(eval.TimedOut): true, string(eval.InfraError): true,
	client.TestWrongAnswer: true, client.TestTimeLimit: true, client.TestMemoryLimit: true, client.TestRuntimeError: true,
	client.TestOutputLimit: true, client.TestNotRun: true, client.CompileError: true,
}

func (m *metrics) verdict(status string) {
	if !statusLabels[status] {
		status = "other"
	}
	m.verdicts.WithLabelValues(status).Inc()
}
