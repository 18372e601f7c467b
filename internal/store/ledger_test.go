package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLedger: top-ups and adjustments sum per team; a sandbox whose usage
// closed is listed uncharged until charged, once, however often it is
// charged; an open one is listed open.
func TestLedger(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		for _, e := range []LedgerEntry{{TeamID: a.ID, Kind: LedgerTopUp, Amount: 100, Note: "first", Actor: "key_1"},
			{TeamID: a.ID, Kind: LedgerAdjust, Amount: -30}, {TeamID: b.ID, Kind: LedgerTopUp, Amount: 7}} {
			if _, err := s.AddLedger(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.AddLedger(ctx, LedgerEntry{TeamID: a.ID, Kind: LedgerCharge, Amount: -1}); err == nil {
			t.Error("a charge through AddLedger was accepted")
		}
		if _, err := s.AddLedger(ctx, LedgerEntry{TeamID: "team_none", Kind: LedgerTopUp, Amount: 1}); !errors.Is(err, ErrNotFound) {
			t.Errorf("a top-up of an unknown team: %v", err)
		}
		if sum, err := s.LedgerSum(ctx, a.ID); err != nil || sum != 70 {
			t.Fatalf("a's sum = %d, %v", sum, err)
		}

		in := newSandbox(a.ID, nil)
		in.Tariff, in.CreatedAt = "standard", time.Now().Add(-time.Minute)
		ended, err := s.InsertSandbox(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		open, err := s.InsertSandbox(ctx, newSandbox(a.ID, nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkEnded(ctx, ended.ID, "deleted", "deleted", time.Now()); err != nil {
			t.Fatal(err)
		}
		un, err := s.UnchargedSegments(ctx, 10)
		if err != nil || len(un) != 1 || un[0].SandboxID != ended.ID {
			t.Fatalf("uncharged = %+v, %v", un, err)
		}
		op, err := s.UnbilledSegments(ctx, a.ID)
		if err != nil || len(op) != 2 {
			t.Fatalf("unbilled = %+v, %v; want the ended one and the open one", op, err)
		}
		if op, _ := s.UnbilledSegments(ctx, b.ID); len(op) != 0 {
			t.Fatalf("b's unbilled = %+v", op)
		}
		for i, want := range []bool{true, false} {
			if ok, err := s.Charge(ctx, a.ID, ended.ID, 25); err != nil || ok != want {
				t.Fatalf("charge %d = %v, %v; want %v", i, ok, err, want)
			}
		}
		if un, _ := s.UnchargedSegments(ctx, 10); len(un) != 0 {
			t.Fatalf("still uncharged: %+v", un)
		}
		if op, _ := s.UnbilledSegments(ctx, a.ID); len(op) != 1 || op[0].SandboxID != open.ID {
			t.Fatalf("unbilled after the charge = %+v; want the open one only", op)
		}
		if sum, _ := s.LedgerSum(ctx, a.ID); sum != 45 {
			t.Fatalf("a's sum after the charge = %d, want 45", sum)
		}
		es, err := s.ListLedger(ctx, a.ID, 10)
		if err != nil || len(es) != 3 || es[0].Kind != LedgerCharge || es[0].SandboxID != ended.ID || es[0].Amount != -25 {
			t.Fatalf("ledger = %+v, %v", es, err)
		}
		for _, e := range es {
			if e.Kind == LedgerTopUp && (e.Note != "first" || e.Actor != "key_1" || e.Amount != 100) {
				t.Errorf("the top-up's entry: %+v", e)
			}
		}
	})
}
