package meter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeStore is the meter's Store in memory: a ledger sum per team and the
// segments.
type fakeStore struct {
	sums    map[string]int64
	segs    []store.UsageSegment
	charged map[string]int64
}

func (f *fakeStore) AccrueUsage(context.Context, time.Time) (int64, error) { return 0, nil }
func (f *fakeStore) UnchargedSegments(context.Context, int) ([]store.UsageSegment, error) {
	var out []store.UsageSegment
	for _, u := range f.segs {
		if _, done := f.charged[u.SandboxID]; !done && u.EndedAt != nil {
			out = append(out, u)
		}
	}
	return out, nil
}
func (f *fakeStore) Charge(_ context.Context, team, id string, cost int64) (bool, error) {
	if _, done := f.charged[id]; done {
		return false, nil
	}
	f.charged[id] = cost
	f.sums[team] -= cost
	return true, nil
}
func (f *fakeStore) UnbilledSegments(_ context.Context, team string) ([]store.UsageSegment, error) {
	var out []store.UsageSegment
	for _, u := range f.segs {
		if _, done := f.charged[u.SandboxID]; !done && (team == "" || u.TeamID == team) {
			out = append(out, u)
		}
	}
	return out, nil
}
func (f *fakeStore) LedgerSum(_ context.Context, team string) (int64, error) {
	return f.sums[team], nil
}

type fakeStopper map[string]string

func (f fakeStopper) EndTeam(_ context.Context, team, reason string) (int, error) {
	f[team] = reason
	return 1, nil
}

// TestBilling: a create the balance cannot cover is 402 (billing on; off,
// nothing is refused); an ended sandbox is charged once; a team at zero is
// warned, then stopped after the grace; a top-up in between clears it.
func TestBilling(t *testing.T) {
	ctx := context.Background()
	tariff := store.Tariff{Name: "standard", PriceVCPUSecond: 1000}
	st := &fakeStore{sums: map[string]int64{"rich": 1_000_000, "poor": 50_000}, charged: map[string]int64{}}
	stop := fakeStopper{}
	rules := Rules{Granularity: time.Second, Minimum: 60 * time.Second}
	m := New(st, stop, Config{Rules: rules, Billing: true, Grace: 10 * time.Second}, nil)

	// 1 vCPU for the 60 s minimum: 60 000.
	if err := m.Admit(ctx, "rich", tariff, 1, 0, 0, 1); err != nil {
		t.Fatalf("rich: %v", err)
	}
	var ae *apierr.Error
	if err := m.Admit(ctx, "poor", tariff, 1, 0, 0, 1); !errors.As(err, &ae) || ae.Code != client.CodeInsufficientBalance {
		t.Fatalf("poor: %v, want insufficient_balance", err)
	}
	// A fork of 20 needs 20 minimums: more than rich has.
	if err := m.Admit(ctx, "rich", tariff, 1, 0, 0, 20); !errors.As(err, &ae) || ae.Code != client.CodeInsufficientBalance {
		t.Fatalf("rich's fork of 20: %v, want insufficient_balance", err)
	}
	if err := New(st, stop, Config{Rules: rules}, nil).Admit(ctx, "poor", tariff, 1, 0, 0, 1); err != nil {
		t.Fatalf("billing off refused: %v", err)
	}

	// An ended sandbox of 30 s at 1 vCPU is charged its minimum, once.
	t0 := time.Now().Add(-time.Hour)
	end := t0.Add(30 * time.Second)
	st.segs = append(st.segs, store.UsageSegment{SandboxID: "sb-1", TeamID: "rich", CPU: 1, PriceVCPUSecond: 1000,
		StartedAt: t0, AccruedUntil: end, EndedAt: &end})
	m.Tick(ctx, time.Now())
	m.Tick(ctx, time.Now())
	if st.charged["sb-1"] != 60_000 || st.sums["rich"] != 940_000 {
		t.Fatalf("charged %v, rich's sum %d", st.charged, st.sums["rich"])
	}

	// poor runs a sandbox that costs more than it has: warned, then stopped.
	st.segs = append(st.segs, store.UsageSegment{SandboxID: "sb-2", TeamID: "poor", CPU: 1, PriceVCPUSecond: 1000,
		StartedAt: t0, AccruedUntil: t0.Add(100 * time.Second)})
	now := time.Now()
	m.Tick(ctx, now)
	if b, _ := m.Balance(ctx, "poor"); b.WarnedAt == nil || b.Available() != 50_000-100_000 {
		t.Fatalf("poor after a tick: %+v", b)
	}
	if len(stop) != 0 {
		t.Fatalf("stopped before the grace: %v", stop)
	}
	m.Tick(ctx, now.Add(5*time.Second))
	if len(stop) != 0 {
		t.Fatalf("stopped before the grace: %v", stop)
	}
	m.Tick(ctx, now.Add(11*time.Second))
	if stop["poor"] != ReasonBalanceExhausted || len(stop) != 1 {
		t.Fatalf("after the grace: %v", stop)
	}

	// A top-up before the grace clears the warning.
	delete(stop, "poor")
	st.segs = append(st.segs, store.UsageSegment{SandboxID: "sb-3", TeamID: "late", CPU: 1, PriceVCPUSecond: 1000,
		StartedAt: t0, AccruedUntil: t0.Add(100 * time.Second)})
	m.Tick(ctx, now)
	st.sums["late"] = 1_000_000
	m.Tick(ctx, now.Add(20*time.Second))
	if b, _ := m.Balance(ctx, "late"); b.WarnedAt != nil || stop["late"] != "" {
		t.Fatalf("late after its top-up: %+v, %v", b, stop)
	}
}
