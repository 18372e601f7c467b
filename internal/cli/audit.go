package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

func newAuditCmd(a *app) *cobra.Command {
	var (
		q            client.AuditQuery
		since, until string
		limit        int
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "audit [--team TEAM_ID] [--action ACTION] [--since TIME] [--until TIME] [--limit N] [--json]",
		Short: "Show the audit log, newest first (admin key only)",
		Long: `Show the audit log, newest first (admin key only): who (team, key) did what
(action) to what (target), from where, and how it ended (HTTP status, error
code). Refused requests of callers with a valid key are in it too.

--since and --until take an RFC 3339 time (2026-01-02T15:04:05Z) or a
duration before now (24h, 90m). --limit bounds the rows shown (default 100).`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if q.Since, err = parseWhen(since); err != nil {
				return usagef(cmd, "--since: %v", err)
			}
			if q.Until, err = parseWhen(until); err != nil {
				return usagef(cmd, "--until: %v", err)
			}
			if limit < 1 {
				return usagef(cmd, "--limit must be at least 1")
			}
			c := a.client()
			events := []client.AuditEvent{}
			for len(events) < limit {
				q.Limit = min(limit-len(events), 1000)
				page, err := c.ListAudit(cmd.Context(), q)
				if err != nil {
					return err
				}
				events = append(events, page.Events...)
				if page.NextCursor == "" {
					break
				}
				q.Cursor = page.NextCursor
			}
			if asJSON {
				return printJSON(out(cmd), client.AuditList{Events: events})
			}
			t := newTable(out(cmd), "AT", "TEAM", "KEY", "ADMIN", "FROM", "ACTION", "TARGET", "STATUS", "CODE")
			for _, e := range events {
				t.row(timeCell(e.At), dash(e.TeamID), dash(e.KeyName), strconv.FormatBool(e.Admin), dash(e.RemoteAddr),
					e.Action, dash(e.Target), strconv.Itoa(e.Status), dash(e.Code))
			}
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.TeamID, "team", "", "only this team's rows (a team id)")
	f.StringVar(&q.Action, "action", "", "only this action's rows, e.g. sandbox.create")
	f.StringVar(&since, "since", "", "only rows at or after this time (RFC 3339, or a duration before now: 24h)")
	f.StringVar(&until, "until", "", "only rows before this time (RFC 3339, or a duration before now)")
	f.IntVar(&limit, "limit", 100, "most rows shown")
	f.BoolVar(&asJSON, "json", false, "print the rows as JSON")
	return cmd
}

// parseWhen reads a time flag: RFC 3339, or a duration before now; "" is
// none.
func parseWhen(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration before now (24h)", v)
	}
	return time.Now().Add(-d), nil
}

// dash is s, or "-" for an empty cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
