package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestAudit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		base := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
		// Ten rows: teams a and b in turn, a second apart; every third a
		// key creation, the others sandbox creates.
		var rows []client.AuditEvent
		for i := range 10 {
			e := client.AuditEvent{At: base.Add(time.Duration(i) * time.Second), TeamID: "team_a", KeyID: "key_a", KeyName: "ci",
				RemoteAddr: "192.0.2.1", Action: client.AuditActionSandboxCreate, Target: "sb", Status: 201}
			if i%2 == 1 {
				e.TeamID, e.KeyID, e.KeyName, e.Admin = "team_b", "key_b", "admin", true
			}
			if i%3 == 0 {
				e.Action, e.Status, e.Code, e.Target = client.AuditActionKeyCreate, 403, client.CodeForbidden, ""
			}
			got, err := s.InsertAudit(ctx, e)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID == "" || !got.At.Equal(norm(e.At)) {
				t.Fatalf("insert: %+v", got)
			}
			rows = append(rows, got)
		}
		if _, err := s.InsertAudit(ctx, client.AuditEvent{}); err == nil {
			t.Error("a row without action was stored")
		}
		if _, err := s.InsertAudit(ctx, rows[0]); !errors.Is(err, ErrConflict) {
			t.Errorf("duplicate id: %v", err)
		}

		// All of them, newest first, as stored.
		all, next, err := s.ListAudit(ctx, AuditFilter{})
		if err != nil || next != "" || len(all) != 10 {
			t.Fatalf("list: %d rows, next %q, %v", len(all), next, err)
		}
		for i, e := range all {
			if want := rows[9-i]; !reflect.DeepEqual(e, want) {
				t.Errorf("row %d:\n%+v\nwant\n%+v", i, e, want)
			}
		}

		// Filters.
		check := func(name string, f AuditFilter, want ...int) {
			t.Helper()
			got, _, err := s.ListAudit(ctx, f)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var ids []string
			for _, e := range got {
				ids = append(ids, e.ID)
			}
			var wantIDs []string
			for _, i := range want {
				wantIDs = append(wantIDs, rows[i].ID)
			}
			if !reflect.DeepEqual(ids, wantIDs) {
				t.Errorf("%s: got %v, want rows %v", name, ids, want)
			}
		}
		check("team", AuditFilter{TeamID: "team_a"}, 8, 6, 4, 2, 0)
		check("action", AuditFilter{Action: client.AuditActionKeyCreate}, 9, 6, 3, 0)
		check("team and action", AuditFilter{TeamID: "team_b", Action: client.AuditActionKeyCreate}, 9, 3)
		check("since", AuditFilter{Since: rows[7].At}, 9, 8, 7)
		check("until", AuditFilter{Until: rows[2].At}, 1, 0)
		check("since and until", AuditFilter{Since: rows[3].At, Until: rows[5].At}, 4, 3)
		check("unknown team", AuditFilter{TeamID: "team_c"})

		// Pages: 4, 4, 2 rows; the cursor goes on after the last row.
		var paged []string
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 3 {
				t.Fatal("too many pages")
			}
			got, next, err := s.ListAudit(ctx, AuditFilter{Limit: 4, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			if next != "" && len(got) != 4 {
				t.Errorf("page %d: %d rows before a next page", pages, len(got))
			}
			for _, e := range got {
				paged = append(paged, e.ID)
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if len(paged) != 10 || paged[0] != rows[9].ID || paged[9] != rows[0].ID {
			t.Errorf("paged: %v", paged)
		}
		// A page of a filtered listing stays filtered.
		got, next, err := s.ListAudit(ctx, AuditFilter{TeamID: "team_a", Limit: 2})
		if err != nil || len(got) != 2 || next == "" {
			t.Fatalf("team page: %d %q %v", len(got), next, err)
		}
		got, _, err = s.ListAudit(ctx, AuditFilter{TeamID: "team_a", Limit: 2, Cursor: next})
		if err != nil || len(got) != 2 || got[0].ID != rows[4].ID || got[1].ID != rows[2].ID {
			t.Errorf("second team page: %+v %v", got, err)
		}
		for _, c := range []string{"x", "12", "12.", "-1." + rows[0].ID, "12.sb_aaaaaaaaaaaaaaaa"} {
			if _, _, err := s.ListAudit(ctx, AuditFilter{Cursor: c}); !errors.Is(err, ErrBadCursor) {
				t.Errorf("cursor %q: %v", c, err)
			}
		}
		// Limits are bounded.
		if got, _, err := s.ListAudit(ctx, AuditFilter{Limit: MaxAuditLimit + 5}); err != nil || len(got) != 10 {
			t.Errorf("large limit: %d %v", len(got), err)
		}

		// Retention.
		n, err := s.DeleteAuditBefore(ctx, rows[4].At)
		if err != nil || n != 4 {
			t.Errorf("delete before: %d %v", n, err)
		}
		check("after the sweep", AuditFilter{}, 9, 8, 7, 6, 5, 4)
		if n, err := s.DeleteAuditBefore(ctx, rows[4].At); err != nil || n != 0 {
			t.Errorf("second sweep: %d %v", n, err)
		}
	})
}

func TestCountRunning(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		var ids []string
		for _, team := range []string{a.ID, a.ID, b.ID, b.ID} {
			sb, err := s.InsertSandbox(ctx, newSandbox(team, nil))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.ID)
		}
		other := newSandbox(b.ID, nil)
		other.Runtime, other.Template = client.RuntimeGVisor, "base"
		if _, err := s.InsertSandbox(ctx, other); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		if err := s.SetPaused(ctx, a.ID, ids[0], &at); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkEnded(ctx, ids[3], client.StateDeleted, "", time.Now()); err != nil {
			t.Fatal(err)
		}
		got, err := s.CountRunning(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []SandboxCount{
			{Runtime: client.RuntimeGVisor, Template: "base", N: 1},
			{Runtime: client.RuntimeNamespaces, Template: "python", N: 2},
			{Runtime: client.RuntimeNamespaces, Template: "python", Paused: true, N: 1},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("counts:\n%+v\nwant\n%+v", got, want)
		}
	})
}
