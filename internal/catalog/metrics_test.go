package catalog

import (
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBuildMetrics: a build that ran is timed by kind and final state,
// its queue wait by kind; one that never started is not.
func TestBuildMetrics(t *testing.T) {
	s := &Service{m: newMetrics()}
	reg := prometheus.NewRegistry()
	if err := s.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	created := time.Now().Add(-time.Minute)
	started, finished := created.Add(20*time.Second), created.Add(50*time.Second)
	s.observeBuild(&client.TemplateBuild{Kind: client.BuildKindBuild, State: client.BuildStateSucceeded, CreatedAt: created, StartedAt: &started, FinishedAt: &finished})
	s.observeBuild(&client.TemplateBuild{Kind: client.BuildKindImport, State: client.BuildStateFailed, CreatedAt: created, StartedAt: &started, FinishedAt: &finished})
	s.observeBuild(&client.TemplateBuild{Kind: client.BuildKindBuild, State: client.BuildStateFailed, CreatedAt: created, FinishedAt: &finished})
	if n := testutil.CollectAndCount(s.m.duration); n != 2 {
		t.Errorf("%d duration series, want 2", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			want := 30.0
			if mf.GetName() == "evalbox_template_build_queue_seconds" {
				want = 20
			}
			if h.GetSampleCount() != 1 || h.GetSampleSum() != want {
				t.Errorf("%s %v: %d samples, sum %v", mf.GetName(), m.GetLabel(), h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
}
