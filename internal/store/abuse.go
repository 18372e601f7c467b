package store

import (
	"context"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// SetCPUAbuseWarned records that the CPU-abuse rule warned the running
// sandbox id at t (client.Sandbox.CPUAbuseWarnedAt). An ended or unknown
// sandbox is left as it is: the rule's loop may sample one as it ends.
func (s *Store) SetCPUAbuseWarned(ctx context.Context, id string, t time.Time) error {
	return s.setRunningTime(ctx, "cpu_abuse_warned_at", id, t)
}

// SetCPUThrottled records that the CPU-abuse rule throttled the running
// sandbox id at t (client.Sandbox.CPUThrottledAt).
func (s *Store) SetCPUThrottled(ctx context.Context, id string, t time.Time) error {
	return s.setRunningTime(ctx, "cpu_throttled_at", id, t)
}

// setRunningTime sets the time column col (a constant of this file) of a
// running sandbox.
func (s *Store) setRunningTime(ctx context.Context, col, id string, t time.Time) error {
	if _, err := s.exec(ctx, `UPDATE sandboxes SET `+col+` = ? WHERE id = ? AND state = ?`, toDB(norm(t)), id, client.StateRunning); err != nil {
		return fmt.Errorf("store: set %s of %s: %w", col, id, err)
	}
	return nil
}
