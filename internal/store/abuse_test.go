package store

import (
	"context"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestCPUAbuseColumns: a sandbox's long_running round-trips, and the
// CPU-abuse rule's warning and throttle times are recorded on a running
// row only.
func TestCPUAbuseColumns(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a := mustTeam(t, s, "a")
		in := newSandbox(a.ID, nil)
		in.LongRunning = true
		sb, err := s.InsertSandbox(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandbox(ctx, a.ID, sb.ID)
		if err != nil || !got.LongRunning || got.CPUAbuseWarnedAt != nil || got.CPUThrottledAt != nil {
			t.Fatalf("inserted: %+v %v", got, err)
		}
		warned, throttled := time.Now().UTC().Truncate(time.Microsecond), time.Now().UTC().Add(time.Second).Truncate(time.Microsecond)
		if err := s.SetCPUAbuseWarned(ctx, sb.ID, warned); err != nil {
			t.Fatal(err)
		}
		if err := s.SetCPUThrottled(ctx, sb.ID, throttled); err != nil {
			t.Fatal(err)
		}
		got, err = s.GetSandbox(ctx, a.ID, sb.ID)
		if err != nil || got.CPUAbuseWarnedAt == nil || !got.CPUAbuseWarnedAt.Equal(warned) || got.CPUThrottledAt == nil || !got.CPUThrottledAt.Equal(throttled) {
			t.Fatalf("after the warning and throttle: %+v %v", got, err)
		}
		// Ended: left as it was.
		if _, err := s.MarkEnded(ctx, sb.ID, client.StateDeleted, client.EndReasonCPUAbuse, time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := s.SetCPUAbuseWarned(ctx, sb.ID, warned.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		got, _ = s.GetSandbox(ctx, a.ID, sb.ID)
		if !got.CPUAbuseWarnedAt.Equal(warned) || got.EndReason != client.EndReasonCPUAbuse {
			t.Errorf("ended: %+v", got)
		}
		// Not long-running by default.
		e, err := s.InsertSandbox(ctx, newSandbox(a.ID, nil))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetSandbox(ctx, a.ID, e.ID); got.LongRunning {
			t.Errorf("default: %+v", got)
		}
	})
}
