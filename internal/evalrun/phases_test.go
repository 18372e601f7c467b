package evalrun

import (
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestPhaseStats(t *testing.T) {
	var ds []time.Duration
	for i := 200; i >= 1; i-- { // 0.5 ms … 100 ms, unsorted
		ds = append(ds, time.Duration(i)*500*time.Microsecond)
	}
	got := phaseStats(ds)
	want := client.PhaseStats{P50Ms: 50, P99Ms: 99, MeanMs: 50.25}
	if got != want {
		t.Fatalf("phaseStats = %+v, want %+v", got, want)
	}
	if got := phaseStats([]time.Duration{7 * time.Millisecond}); got != (client.PhaseStats{P50Ms: 7, P99Ms: 7, MeanMs: 7}) {
		t.Fatalf("one trial: %+v", got)
	}
	if got := phaseStats(nil); got != (client.PhaseStats{}) {
		t.Fatalf("no trials: %+v", got)
	}
}
