package evalrun

import (
	"context"
	"slices"
	"time"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// Trial phases as the summary names them.
const (
	phaseCreate = "create"
	phaseWrite  = "write"
	phaseRun    = "run"
	phaseDelete = "delete"
	phaseTrial  = "trial"
)

// trialTimes is what a trial's outcome records of its time.
func trialTimes(out trial.Outcome) store.TrialTimes {
	p := out.Phases
	return store.TrialTimes{Create: p.Create, Write: p.Write, Run: p.Run, Delete: p.Delete, Trial: out.Duration, Attempts: out.Attempts}
}

// phases summarises where a run's recorded trials spent their time (nil
// when no trial recorded its times).
func (s *Service) phases(ctx context.Context, run client.EvalRun) (map[string]client.PhaseStats, error) {
	ds := map[string][]time.Duration{}
	err := s.st.EvalTimes(ctx, run.TeamID, run.ID, func(t store.TrialTimes) error {
		ds[phaseTrial] = append(ds[phaseTrial], t.Trial)
		if t.Create+t.Write+t.Run+t.Delete == 0 {
			return nil // every attempt failed: no completed attempt to split
		}
		ds[phaseCreate] = append(ds[phaseCreate], t.Create)
		ds[phaseWrite] = append(ds[phaseWrite], t.Write)
		ds[phaseRun] = append(ds[phaseRun], t.Run)
		ds[phaseDelete] = append(ds[phaseDelete], t.Delete)
		return nil
	})
	if err != nil || len(ds) == 0 {
		return nil, err
	}
	out := make(map[string]client.PhaseStats, len(ds))
	for name, d := range ds {
		out[name] = phaseStats(d)
	}
	return out, nil
}

// phaseStats returns the p50, p99 (nearest rank) and mean of durations, in
// milliseconds. It sorts ds.
func phaseStats(ds []time.Duration) client.PhaseStats {
	if len(ds) == 0 {
		return client.PhaseStats{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return client.PhaseStats{P50Ms: msOf(percentile(ds, 50)), P99Ms: msOf(percentile(ds, 99)), MeanMs: msOf(sum / time.Duration(len(ds)))}
}

// percentile returns the nearest-rank p-th percentile of sorted durations
// (0 for none).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted)) + 0.9999999)
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
