package store

import (
	"context"
	"fmt"
)

// SandboxCount is how many running sandboxes share a runtime and a
// template name, paused or not (a metric's series).
type SandboxCount struct {
	Runtime, Template string
	Paused            bool
	N                 int
}

// CountRunning counts the running sandboxes (every team's, every node's)
// by runtime, template name and whether they are paused: what
// /metrics reports at each scrape. Ended rows are not counted (they
// only grow).
func (s *Store) CountRunning(ctx context.Context) ([]SandboxCount, error) {
	rows, err := s.query(ctx, `SELECT runtime, template, CASE WHEN paused_at IS NULL THEN 0 ELSE 1 END, COUNT(*)
		FROM sandboxes WHERE state = 'running' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`)
	if err != nil {
		return nil, fmt.Errorf("store: count running sandboxes: %w", err)
	}
	defer rows.Close()
	var out []SandboxCount
	for rows.Next() {
		var c SandboxCount
		var paused int64
		if err := rows.Scan(&c.Runtime, &c.Template, &paused, &c.N); err != nil {
			return nil, fmt.Errorf("store: count running sandboxes: %w", err)
		}
		c.Paused = paused != 0
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: count running sandboxes: %w", err)
	}
	return out, nil
}
