package sandbox

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSandboxSeriesCapsTemplates: past maxTemplateLabels names, the
// templates with the fewest sandboxes are summed as "other".
func TestSandboxSeriesCapsTemplates(t *testing.T) {
	var counts []store.SandboxCount
	for i := range maxTemplateLabels + 5 {
		counts = append(counts, store.SandboxCount{Runtime: client.RuntimeGVisor, Template: fmt.Sprintf("t%03d", i), N: 100 - i})
	}
	counts = append(counts,
		store.SandboxCount{Runtime: client.RuntimeGVisor, Template: "t000", Paused: true, N: 2},
		store.SandboxCount{Runtime: "weird", Template: "t001", N: 1})
	got := sandboxSeries(counts)
	if len(got) != maxTemplateLabels+3 {
		t.Errorf("%d series", len(got))
	}
	if n := got[sandboxKey{client.StateRunning, client.RuntimeGVisor, "other"}]; n != 50+49+48+47+46 {
		t.Errorf("other: %d", n)
	}
	if n := got[sandboxKey{client.StatePaused, client.RuntimeGVisor, "t000"}]; n != 2 {
		t.Errorf("paused: %d", n)
	}
	if n := got[sandboxKey{client.StateRunning, "other", "t001"}]; n != 1 {
		t.Errorf("unknown runtime: %d", n)
	}
}

// counterStore is a Store with CountRunning.
type counterStore struct {
	Store
	counts []store.SandboxCount
}

func (c *counterStore) CountRunning(context.Context) ([]store.SandboxCount, error) {
	return c.counts, nil
}

// poolNode reports pools and capacity.
type poolNode struct{ *fakeNode }

func (poolNode) Pools(context.Context) ([]nodeapi.PoolStatus, error) {
	return []nodeapi.PoolStatus{{Spec: nodeapi.Spec{Template: "sha256:1", Runtime: client.RuntimeGVisor}, TemplateName: "python", Target: 4, Ready: 3}}, nil
}

func (poolNode) Capacity(context.Context) (nodeapi.CapacityStatus, error) {
	return nodeapi.CapacityStatus{Budget: nodeapi.Resources{Pids: 1000, MemoryBytes: 1 << 30}, Reserved: nodeapi.Resources{Pids: 10}, Waiting: 2}, nil
}

// TestMetrics: creates, execs and ends are counted; the state collector
// reports what runs, and a series that went is 0 for one scrape.
func TestMetrics(t *testing.T) {
	f := newFakeNode()
	svc, st := newTestService(t, poolNode{f})
	cs := &counterStore{Store: st, counts: []store.SandboxCount{{Runtime: "fake", Template: "base", N: 1}}}
	svc.store = cs
	reg := prometheus.NewRegistry()
	if err := svc.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	sb, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "nope"}); err == nil {
		t.Fatal("unknown template created")
	}
	if _, err := svc.Exec(ctx, "team", sb.ID, client.ExecRequest{Cmd: "true"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Exec(ctx, "team", "sb-nope", client.ExecRequest{Cmd: "true"}, nil, nil); err == nil {
		t.Fatal("exec in no sandbox")
	}
	if err := svc.Delete(ctx, "team", sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(svc.m.ended.WithLabelValues(client.StateDeleted)); got != 1 {
		t.Errorf("ended: %v", got)
	}
	want := `
# HELP evalbox_host_capacity_waiting Creates queued for host capacity now (wait_seconds).
# TYPE evalbox_host_capacity_waiting gauge
evalbox_host_capacity_waiting 2
# HELP evalbox_pool_ready Warm-pool sandboxes ready to be claimed now, by template and runtime.
# TYPE evalbox_pool_ready gauge
evalbox_pool_ready{runtime="gvisor",template="python"} 3
# HELP evalbox_sandboxes Running sandboxes now (every replica's, from the database), by state (running or paused), runtime and template name.
# TYPE evalbox_sandboxes gauge
evalbox_sandboxes{runtime="other",state="running",template="base"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "evalbox_sandboxes", "evalbox_pool_ready", "evalbox_host_capacity_waiting"); err != nil {
		t.Error(err)
	}
	// The sandbox went: 0 once, then no series.
	cs.counts = nil
	for _, want := range []string{`evalbox_sandboxes{runtime="other",state="running",template="base"} 0`, ""} {
		text := ""
		if want != "" {
			text = "# HELP evalbox_sandboxes Running sandboxes now (every replica's, from the database), by state (running or paused), runtime and template name.\n# TYPE evalbox_sandboxes gauge\n" + want + "\n"
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(text), "evalbox_sandboxes"); err != nil {
			t.Error(err)
		}
	}
	for _, c := range []struct {
		name, labels string
		want         int
	}{
		{"evalbox_sandbox_create_duration_seconds", `from_pool="false",outcome="ok",runtime="other"`, 1},
		{"evalbox_sandbox_create_duration_seconds", `from_pool="false",outcome="not_found",runtime="other"`, 1},
		{"evalbox_exec_duration_seconds", `runtime="other",status="exited"`, 1},
		{"evalbox_exec_duration_seconds", `runtime="other",status="error"`, 1},
	} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() != c.name {
				continue
			}
			for _, m := range mf.GetMetric() {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				if strings.Join(ls, ",") == c.labels {
					found = true
					if n := m.GetHistogram().GetSampleCount(); n != uint64(c.want) {
						t.Errorf("%s{%s}: %d samples", c.name, c.labels, n)
					}
				}
			}
		}
		if !found {
			t.Errorf("no %s{%s}", c.name, c.labels)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}
