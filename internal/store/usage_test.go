package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestTariffs: the built-ins are seeded; put, replace, get, delete.
func TestTariffs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		ts, err := s.ListTariffs(ctx)
		if err != nil || len(ts) != 3 || ts[0].Name != "large" || ts[1].Name != "small" || ts[2].Name != "standard" {
			t.Fatalf("built-ins = %+v, %v", ts, err)
		}
		if ts[2].CPU != 2 || ts[2].MemoryMB != 2048 || ts[2].PriceVCPUSecond != 14000 {
			t.Errorf("standard = %+v", ts[2])
		}
		created, err := s.PutTariff(ctx, Tariff{Name: "gpu-ish", CPU: 8, MemoryMB: 8192, DiskMB: 4096, PriceVCPUSecond: 1, PriceGiBSecond: 2, PriceDiskGiBSecond: 3})
		if err != nil || !created {
			t.Fatalf("put = %v, %v", created, err)
		}
		if created, err := s.PutTariff(ctx, Tariff{Name: "gpu-ish", CPU: 4, MemoryMB: 8192, DiskMB: 4096, PriceVCPUSecond: 5}); err != nil || created {
			t.Fatalf("replace = %v, %v", created, err)
		}
		got, err := s.GetTariff(ctx, "gpu-ish")
		if err != nil || got.CPU != 4 || got.PriceVCPUSecond != 5 || got.PriceGiBSecond != 0 {
			t.Fatalf("get = %+v, %v", got, err)
		}
		th, w := 0.5, 90*time.Second
		if _, err := s.PutTariff(ctx, Tariff{Name: "strict", CPU: 1, MemoryMB: 256, DiskMB: 512, CPUAbuseThreshold: &th, CPUAbuseWindow: &w}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetTariff(ctx, "strict"); err != nil || got.CPUAbuseThreshold == nil || *got.CPUAbuseThreshold != 0.5 ||
			got.CPUAbuseWindow == nil || *got.CPUAbuseWindow != w {
			t.Fatalf("strict = %+v, %v", got, err)
		}
		if got.CPUAbuseThreshold != nil || got.CPUAbuseWindow != nil {
			t.Errorf("a tariff without its own rule reads back %v, %v", got.CPUAbuseThreshold, got.CPUAbuseWindow)
		}
		if err := s.DeleteTariff(ctx, "gpu-ish"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetTariff(ctx, "gpu-ish"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}
		if err := s.DeleteTariff(ctx, "gpu-ish"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
	})
}

// TestUsageSegments: a sandbox's row opens its usage, priced by its
// tariff; the tick advances only open segments and never backwards; a
// pause and a resume switch segments; an end closes the last one at the
// end, a sandbox found lost where the last tick left it; the read filters
// by team and window.
func TestUsageSegments(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		t0 := norm(time.Now().Add(-time.Hour))
		mk := func(team string, meta map[string]string) client.Sandbox {
			in := newSandbox(team, meta)
			in.Tariff, in.CreatedAt = "standard", t0
			sb, err := s.InsertSandbox(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			return sb
		}
		x := mk(a.ID, map[string]string{"eval_run": "run-1"})
		y := mk(a.ID, nil)
		z := mk(b.ID, nil)

		if _, err := s.AccrueUsage(ctx, t0.Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		// x pauses at 10 s, resumes at 20 s, ends at 25 s.
		pause, resume := t0.Add(10*time.Second), t0.Add(20*time.Second)
		if err := s.SetPaused(ctx, a.ID, x.ID, &pause); err != nil {
			t.Fatal(err)
		}
		// The resume's time is now: move the clock by recording it directly.
		if err := s.SetPaused(ctx, a.ID, x.ID, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkEnded(ctx, x.ID, client.StateDeleted, "deleted", t0.Add(25*time.Second)); err != nil {
			t.Fatal(err)
		}
		// y is found lost: closed at the last tick (10 s), not at the end time.
		if _, err := s.MarkEnded(ctx, y.ID, client.StateLost, "lost", t0.Add(50*time.Minute)); err != nil {
			t.Fatal(err)
		}
		// A tick in the past moves nothing back.
		if _, err := s.AccrueUsage(ctx, t0.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}

		segs, err := s.UsageSegments(ctx, a.ID, t0.Add(-time.Minute), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		var xs, ys []UsageSegment
		for _, u := range segs {
			switch u.SandboxID {
			case x.ID:
				xs = append(xs, u)
			case y.ID:
				ys = append(ys, u)
			default:
				t.Errorf("team a's usage holds %s", u.SandboxID)
			}
		}
		if len(xs) != 3 || len(ys) != 1 {
			t.Fatalf("segments x %+v, y %+v", xs, ys)
		}
		if xs[0].Paused || !xs[1].Paused || xs[2].Paused || xs[0].EvalRun != "run-1" || xs[0].PriceVCPUSecond != 14000 || xs[0].CPU != 1 {
			t.Errorf("x's segments = %+v", xs)
		}
		if !xs[0].StartedAt.Equal(t0) || !xs[0].End().Equal(pause) || !xs[1].StartedAt.Equal(pause) {
			t.Errorf("x's first two segments: %v–%v, %v", xs[0].StartedAt, xs[0].End(), xs[1].StartedAt)
		}
		// The resume happened now (after t0+25 s): the last segment starts
		// then and, ended before it, is empty rather than negative.
		if xs[1].EndedAt == nil || xs[2].EndedAt == nil || xs[2].End().Before(xs[2].StartedAt) && !xs[2].End().Equal(xs[2].AccruedUntil) {
			t.Errorf("x's last segments: %+v", xs[1:])
		}
		_ = resume
		if ys[0].EndedAt == nil || !ys[0].End().Equal(t0.Add(10*time.Second)) {
			t.Errorf("lost y closed at %v, want the last tick %v", ys[0].End(), t0.Add(10*time.Second))
		}
		// Every team, and a window that misses everything.
		all, err := s.UsageSegments(ctx, "", t0.Add(-time.Minute), time.Now().Add(time.Hour))
		if err != nil || len(all) != 5 {
			t.Fatalf("every team's = %d, %v; want 5", len(all), err)
		}
		if none, err := s.UsageSegments(ctx, "", t0.Add(-2*time.Hour), t0.Add(-time.Hour)); err != nil || len(none) != 0 {
			t.Fatalf("a window before everything: %+v, %v", none, err)
		}
		// z is still open: the next tick advances it.
		if n, err := s.AccrueUsage(ctx, t0.Add(30*time.Second)); err != nil || n != 1 {
			t.Fatalf("tick = %d, %v; want only z's segment", n, err)
		}
		if ok, err := s.MarkExpired(ctx, z.ID, time.Now().Add(2*time.Hour)); err != nil || !ok {
			t.Fatalf("expire z = %v, %v", ok, err)
		}
		zs, _ := s.UsageSegments(ctx, b.ID, t0.Add(-time.Minute), time.Now().Add(3*time.Hour))
		if len(zs) != 1 || zs[0].EndedAt == nil || zs[0].End().Before(time.Now().Add(time.Hour)) {
			t.Errorf("expired z = %+v", zs)
		}
	})
}
