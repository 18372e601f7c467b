package meter

import (
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/store"
)

func TestMoney(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1": Nano, "0.000014": 14000, "12.5": 12*Nano + Nano/2, ".5": Nano / 2, "0.000000001": 1} {
		got, err := ParseMoney(in)
		if err != nil || got != want {
			t.Errorf("ParseMoney(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1e3", "0.0000000001", "1.2.3", "x", "99999999999"} {
		if _, err := ParseMoney(bad); err == nil {
			t.Errorf("ParseMoney(%q) accepted", bad)
		}
	}
	for n, want := range map[int64]string{0: "0", 14000: "0.000014", 12*Nano + Nano/2: "12.5", -Nano: "-1"} {
		if got := FormatMoney(n); got != want {
			t.Errorf("FormatMoney(%d) = %q, want %q", n, got, want)
		}
	}
}

var t0 = time.Date(2026, 12, 1, 23, 59, 0, 0, time.UTC)

func seg(id string, seq int, paused bool, start time.Time, d time.Duration, open bool) store.UsageSegment {
	u := store.UsageSegment{SandboxID: id, Seq: seq, TeamID: "t", Template: "base", Tariff: "standard", EvalRun: "",
		CPU: 2, MemoryMB: 2048, DiskMB: 1024, PriceVCPUSecond: 1000, PriceGiBSecond: 100, PriceDiskGiBSecond: 10,
		Paused: paused, StartedAt: start, AccruedUntil: start.Add(d)}
	if !open {
		end := start.Add(d)
		u.EndedAt = &end
	}
	return u
}

// TestReport: the minimum and the rounding per sandbox, paused time billed
// for disk only, a window that cuts a segment, and a day boundary.
func TestReport(t *testing.T) {
	segs := []store.UsageSegment{
		seg("a", 0, false, t0, 1500*time.Millisecond, false), // 1.5 s: billed the minimum
		seg("b", 0, false, t0, 3*time.Second, false),         // runs 3 s,
		seg("b", 1, true, t0.Add(3*time.Second), 10*time.Second, false),
		seg("b", 2, false, t0.Add(13*time.Second), 70*time.Second, true), // then 70 s more, still running
	}
	rules := Rules{Granularity: time.Second, Minimum: 2 * time.Second}
	lines, total := Report(segs, t0.Add(-time.Hour), t0.Add(time.Hour), BySandbox, rules)
	if len(lines) != 2 || lines[0].Key != "a" || lines[1].Key != "b" {
		t.Fatalf("lines = %+v", lines)
	}
	a, b := lines[0], lines[1]
	if a.Running != 1500*time.Millisecond || a.Billed != 2*time.Second {
		t.Errorf("a: running %v billed %v; want 1.5s and the 2s minimum", a.Running, a.Billed)
	}
	if b.Running != 73*time.Second || b.Paused != 10*time.Second || b.Billed != 73*time.Second || b.BilledPaused != 10*time.Second {
		t.Errorf("b = %+v", b)
	}
	// Cost per second running: 2 vCPU × 1000 + 2 GiB × 100 + 1 GiB × 10 =
	// 2210; paused: 10 (disk).
	if a.Cost != 2*2210 || b.Cost != 73*2210+10*10 {
		t.Errorf("costs a %d, b %d; want %d, %d", a.Cost, b.Cost, 2*2210, 73*2210+10*10)
	}
	if total.Sandboxes != 2 || total.Cost != a.Cost+b.Cost || total.Billed != 75*time.Second {
		t.Errorf("total = %+v", total)
	}

	// A window that starts after a's start: no minimum for a, b cut.
	lines, _ = Report(segs, t0.Add(time.Second), t0.Add(20*time.Second), BySandbox, rules)
	if len(lines) != 2 || lines[0].Running != 500*time.Millisecond || lines[0].Billed != time.Second {
		t.Fatalf("cut a = %+v", lines)
	}
	if lines[1].Running != 2*time.Second+7*time.Second || lines[1].Paused != 10*time.Second {
		t.Errorf("cut b = %+v", lines[1])
	}

	// By day: t0 is 23:59 UTC; b's last segment runs into the next day.
	lines, total = Report(segs, t0.Add(-time.Hour), t0.Add(time.Hour), ByDay, rules)
	if len(lines) != 2 || lines[0].Key != "2026-12-01" || lines[1].Key != "2026-12-02" {
		t.Fatalf("by day = %+v", lines)
	}
	// Day 1: a 1.5 s, b 3 s and 47 s of its last segment; day 2: 23 s.
	if lines[0].Running != 51500*time.Millisecond || lines[1].Running != 23*time.Second {
		t.Errorf("by day running %v, %v", lines[0].Running, lines[1].Running)
	}
	if total.Sandboxes != 2 {
		t.Errorf("by day, total sandboxes %d, want 2 (b is in both days)", total.Sandboxes)
	}

	// By tariff: one group; no minimum at all (negative).
	lines, _ = Report(segs, t0.Add(-time.Hour), t0.Add(time.Hour), ByTariff, Rules{Minimum: -1})
	if len(lines) != 1 || lines[0].Key != "standard" || lines[0].Billed != 2*time.Second+73*time.Second {
		t.Errorf("by tariff = %+v", lines)
	}
}
