package trial

import (
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	var none *Metrics
	none.observe("eval", Outcome{}) // a Runner without metrics counts nothing
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	m.observe("eval", Outcome{Result: client.ExecResult{Status: client.StatusExited}, Attempts: 1, Duration: time.Second})
	m.observe("eval", Outcome{Result: client.ExecResult{Status: client.StatusError}, Attempts: 3, Duration: time.Second})
	m.observe("execute", Outcome{Result: client.ExecResult{Status: "strange"}, Attempts: 1})
	for _, c := range []struct {
		source, status string
		want           float64
	}{{"eval", client.StatusExited, 1}, {"eval", client.StatusError, 1}, {"execute", "other", 1}} {
		if got := testutil.ToFloat64(m.trials.WithLabelValues(c.source, c.status)); got != c.want {
			t.Errorf("%s/%s: %v", c.source, c.status, got)
		}
	}
	if got := testutil.ToFloat64(m.attempts.WithLabelValues("eval")); got != 4 {
		t.Errorf("eval attempts: %v", got)
	}
}
