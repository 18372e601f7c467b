package evalrun

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestVerdictLabels: a verdict's status is a label only when it is a
// judge's word; anything else is "other".
func TestVerdictLabels(t *testing.T) {
	m := newMetrics()
	for _, s := range []string{"passed", "wrong_answer", "passed", "Failed: AssertionError('x')", "", "made_up_status"} {
		m.verdict(s)
	}
	for status, want := range map[string]float64{"passed": 2, "wrong_answer": 1, "other": 3} {
		if got := testutil.ToFloat64(m.verdicts.WithLabelValues(status)); got != want {
			t.Errorf("%s: %v, want %v", status, got, want)
		}
	}
}
