package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/sandbox/sandboxtest"
	"github.com/evalbox/evalbox/pkg/client"
)

// sample is a SandboxStats at t0+at of a sandbox that has used used of
// CPU time under a quota of cpu cores.
func sample(t0 time.Time, at, used time.Duration, cpu float64) nodeapi.SandboxStats {
	return nodeapi.SandboxStats{CPUUsageNs: int64(used), CPU: cpu, SampledAt: t0.Add(at)}
}

func TestCPUWindow(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	const window = 100 * time.Second
	type step struct {
		at, used time.Duration // since t0
		cpu      float64
		want     cpuAction
	}
	for _, tc := range []struct {
		name        string
		longRunning bool
		steps       []step
	}{
		{"ephemeral spinner: warned at 80 %, stopped at the window", false, []step{
			{0, 0, 1, cpuNone}, // the first sample only starts the measure
			{10 * time.Second, 10 * time.Second, 1, cpuNone},
			{70 * time.Second, 70 * time.Second, 1, cpuNone},
			{80 * time.Second, 80 * time.Second, 1, cpuWarn},
			{90 * time.Second, 90 * time.Second, 1, cpuNone}, // warned once
			{100 * time.Second, 100 * time.Second, 1, cpuStop},
		}},
		{"a dip below the threshold starts the window again", false, []step{
			{0, 0, 1, cpuNone},
			{80 * time.Second, 80 * time.Second, 1, cpuWarn},
			{90 * time.Second, 81 * time.Second, 1, cpuNone}, // 10 % for 10 s
			{150 * time.Second, 141 * time.Second, 1, cpuNone},
			{170 * time.Second, 161 * time.Second, 1, cpuWarn}, // warned again
			{190 * time.Second, 181 * time.Second, 1, cpuStop},
		}},
		{"the threshold is of the quota: 0.5 of 0.5 cores is all of it", false, []step{
			{0, 0, 0.5, cpuNone},
			{50 * time.Second, 25 * time.Second, 0.5, cpuNone},
			{100 * time.Second, 50 * time.Second, 0.5, cpuStop},
		}},
		{"below the threshold is never judged", false, []step{
			{0, 0, 1, cpuNone},
			{100 * time.Second, 85 * time.Second, 1, cpuNone},
			{300 * time.Second, 255 * time.Second, 1, cpuNone},
		}},
		{"a counter that went back (a resume) starts again", false, []step{
			{0, 0, 1, cpuNone},
			{80 * time.Second, 80 * time.Second, 1, cpuWarn},
			{90 * time.Second, 1 * time.Second, 1, cpuNone},
			{150 * time.Second, 61 * time.Second, 1, cpuNone},
			{170 * time.Second, 81 * time.Second, 1, cpuWarn},
		}},
		{"long-running: throttled once, and again only when its quota came back", true, []step{
			{0, 0, 1, cpuNone},
			{80 * time.Second, 80 * time.Second, 1, cpuWarn},
			{100 * time.Second, 100 * time.Second, 1, cpuThrottle},
			{110 * time.Second, 105 * time.Second, 0.5, cpuNone},
			{500 * time.Second, 305 * time.Second, 0.5, cpuNone}, // all of its halved quota: left alone
			{510 * time.Second, 1 * time.Second, 1, cpuThrottle}, // resumed with the shape's quota
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w cpuWindow
			for i, s := range tc.steps {
				act, f, above := w.observe(sample(t0, s.at, s.used, s.cpu), 0.9, window, tc.longRunning)
				if act != s.want {
					t.Fatalf("step %d (%v): action %d, want %d (fraction %.2f, above for %v)", i, s.at, act, s.want, f, above)
				}
				if act == cpuThrottle {
					w.throttled = 0.5 // as cpuAct does once Throttle succeeds
				}
			}
		})
	}
}

// statsNode is a fakeNode whose sandboxes use CPU at a rate the test sets
// (a share of their quota), on a clock the test advances.
type statsNode struct {
	*fakeNode
	mu        sync.Mutex
	now       time.Time
	rate      map[string]float64 // share of the quota used
	used      map[string]time.Duration
	cpu       map[string]float64
	throttles map[string]float64
	paused    map[string]bool
}

func newStatsNode() *statsNode {
	return &statsNode{fakeNode: newFakeNode(), now: time.Unix(1_000_000, 0), rate: map[string]float64{},
		used: map[string]time.Duration{}, cpu: map[string]float64{}, throttles: map[string]float64{}, paused: map[string]bool{}}
}

func (n *statsNode) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	info, err := n.fakeNode.Create(ctx, req)
	if err == nil {
		n.mu.Lock()
		n.cpu[info.ID] = req.Spec.Shape.CPU
		n.mu.Unlock()
	}
	return info, err
}

func (n *statsNode) Stats(_ context.Context, id string) (nodeapi.SandboxStats, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.paused[id] {
		return nodeapi.SandboxStats{}, &apierr.Error{Code: client.CodeSandboxNotRunning, Message: "paused"}
	}
	return nodeapi.SandboxStats{CPUUsageNs: int64(n.used[id]), CPU: n.cpu[id], SampledAt: n.now}, nil
}

func (n *statsNode) Throttle(_ context.Context, id string, cpu float64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cpu[id], n.throttles[id] = cpu, cpu
	return nil
}

// advance moves the clock on by d, each sandbox using its rate of its
// quota meanwhile.
func (n *statsNode) advance(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.now = n.now.Add(d)
	for id, r := range n.rate {
		n.used[id] += time.Duration(r * n.cpu[id] * float64(d))
	}
}

func (n *statsNode) setRate(id string, r float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.rate[id] = r
}

// TestCPUAbuseSampling drives the rule's sampling by hand on a fake clock: the
// ephemeral spinner is warned, then stopped with cpu_abuse; the idle
// sandbox and the one below the threshold go on; the long-running
// spinner is warned, then throttled to half its CPU and goes on.
func TestCPUAbuseSampling(t *testing.T) {
	n := newStatsNode()
	st := sandboxtest.NewMemStore()
	// Interval an hour: the loop never ticks, the test samples.
	svc := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour,
		CPUAbuse: CPUAbuseConfig{Threshold: 0.9, Window: time.Minute, Interval: time.Hour}},
		st, n, fakeTemplates{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { svc.Close(context.Background()) })
	ctx := context.Background()
	create := func(longRunning bool, rate float64) string {
		sb, err := svc.Create(ctx, "team-a", client.CreateSandboxRequest{Template: "base", CPU: 1, LongRunning: longRunning})
		if err != nil {
			t.Fatal(err)
		}
		n.setRate(sb.ID, rate)
		return sb.ID
	}
	spinner, idle, busy, longSpinner := create(false, 1), create(false, 0), create(false, 0.85), create(true, 0.98)
	if !st.Row(longSpinner).LongRunning || st.Row(spinner).LongRunning {
		t.Fatal("long_running not recorded on the rows")
	}
	windows := map[string]*cpuWindow{}
	step := func() { n.advance(10 * time.Second); svc.sampleCPU(windows) }
	svc.sampleCPU(windows) // the first samples
	for range 4 {
		step() // 40 s above: no warning yet
	}
	if r := st.Row(spinner); r.CPUAbuseWarnedAt != nil {
		t.Fatalf("warned at 40 s of a 60 s window: %+v", r)
	}
	step() // 50 s: past 80 %
	for _, id := range []string{spinner, longSpinner} {
		if r := st.Row(id); r.CPUAbuseWarnedAt == nil || r.State != client.StateRunning {
			t.Fatalf("%s not warned at 50 s of a 60 s window: %+v", id, r)
		}
	}
	step() // 60 s: the window
	if r := st.Row(spinner); r.State != client.StateDeleted || r.EndReason != client.EndReasonCPUAbuse {
		t.Fatalf("the spinner after the window: %s (%s)", r.State, r.EndReason)
	}
	if !n.isDestroyed(spinner) {
		t.Error("the spinner was not destroyed on its node")
	}
	r := st.Row(longSpinner)
	if r.State != client.StateRunning || r.CPUThrottledAt == nil || n.throttles[longSpinner] != 0.5 {
		t.Fatalf("the long-running spinner after the window: %+v, throttled to %v", r, n.throttles[longSpinner])
	}
	for range 20 {
		step()
	}
	for _, id := range []string{idle, busy, longSpinner} {
		if r := st.Row(id); r.State != client.StateRunning || r.CPUAbuseWarnedAt != nil && id != longSpinner {
			t.Errorf("%s: %+v", id, r)
		}
	}
	// A paused sandbox has no sample; one resumed (quota and counter
	// back to the start) is throttled again.
	n.mu.Lock()
	n.paused[longSpinner] = true
	n.mu.Unlock()
	step()
	n.mu.Lock()
	n.paused[longSpinner], n.cpu[longSpinner], n.used[longSpinner] = false, 1, 0
	delete(n.throttles, longSpinner)
	n.mu.Unlock()
	step()
	if n.throttles[longSpinner] != 0.5 {
		t.Errorf("a resumed long-running sandbox was not throttled again: %v", n.throttles)
	}
	if len(windows) != 3 {
		t.Errorf("windows of ended sandboxes kept: %d", len(windows))
	}
}

// TestCPUAbuseLimits: the per-sandbox seam (per tariff, later) overrides
// the server's threshold and window, and a zero window exempts.
func TestCPUAbuseLimits(t *testing.T) {
	c := CPUAbuseConfig{Threshold: 0.9, Window: time.Minute, Limits: func(row client.Sandbox) (float64, time.Duration, bool) {
		switch row.Tariff {
		case "large":
			return 0.5, time.Hour, true
		case "free":
			return 0, 0, true
		}
		return 0, 0, false
	}}
	for tariff, want := range map[string]struct {
		th float64
		w  time.Duration
	}{"": {0.9, time.Minute}, "large": {0.5, time.Hour}, "free": {0, 0}} {
		if th, w := c.limitsOf(client.Sandbox{Tariff: tariff}); th != want.th || w != want.w {
			t.Errorf("tariff %q: %v, %v", tariff, th, w)
		}
	}
}

// TestCPUAbuseLoop runs the loop itself on real time: a spinner with a
// window of a few intervals ends with cpu_abuse.
func TestCPUAbuseLoop(t *testing.T) {
	n := newStatsNode()
	st := sandboxtest.NewMemStore()
	svc := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour,
		CPUAbuse: CPUAbuseConfig{Threshold: 0.9, Window: 50 * time.Millisecond, Interval: 10 * time.Millisecond}},
		st, n, fakeTemplates{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { svc.Close(context.Background()) })
	sb, err := svc.Create(context.Background(), "team-a", client.CreateSandboxRequest{Template: "base", CPU: 1})
	if err != nil {
		t.Fatal(err)
	}
	n.setRate(sb.ID, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				n.advance(5 * time.Millisecond)
			}
		}
	}()
	waitFor(t, "the spinner's end", func() bool { return st.Row(sb.ID).EndReason == client.EndReasonCPUAbuse })
}
