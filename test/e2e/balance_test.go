package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestBalance: with billing on, a team without money cannot create (402
// insufficient_balance, nothing made); topped up, it can; when its balance
// runs out its sandbox is warned, then stopped (balance_exhausted) after
// the grace, and charged; a new top-up lets it create again. Only admins
// top up, and a team sees its own balance only.
func TestBalance(t *testing.T) {
	s := startServerT(t, serverOptions{args: []string{"--billing", "on", "--billing-minimum", "2s", "--billing-grace", "1s",
		"--meter-interval", "200ms"}})
	c, team, key := newTeam(t, s, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	other, otherTeam, _ := newTeam(t, s, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	ctx := ctxT(t, 5*time.Minute)
	small := client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, Tariff: "small"}

	if _, err := c.CreateSandbox(ctx, small); !client.IsInsufficientBalance(err) {
		t.Fatalf("a create with no balance: %v, want insufficient_balance", err)
	}
	if sbs, err := c.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Fatalf("after the refusal: %+v, %v", sbs, err)
	}
	// Only admins top up; bad amounts are refused.
	if _, err := c.TopUp(ctx, team.ID, client.TopUpRequest{Amount: "100"}); client.ErrorCode(err) != client.CodeForbidden {
		t.Fatalf("a team topping itself up: %v", err)
	}
	for _, bad := range []client.TopUpRequest{{Amount: "abc"}, {Amount: "-1"}, {Amount: "0"}, {Amount: "1", Kind: "gift"}} {
		if _, err := s.admin.TopUp(ctx, team.ID, bad); client.ErrorCode(err) != client.CodeBadRequest {
			t.Errorf("top-up %+v: %v, want bad_request", bad, err)
		}
	}
	if _, err := s.admin.TopUp(ctx, "team_nope", client.TopUpRequest{Amount: "1"}); !client.IsNotFound(err) {
		t.Errorf("a top-up of an unknown team: %v", err)
	}
	// small costs 1 × 0.000014 + 0.5 × 0.0000045 + 2 × 0.00000004 =
	// 0.00001633 a second: 0.0001 runs it about 6 s.
	out, errOut, code := runCLIOn(t, s, ctx, s.adminKey, "", "balance", "top-up", team.ID, "0.0001", "--note", "test credit")
	if code != 0 || strings.TrimSpace(out) != "0.0001" {
		t.Fatalf("balance top-up: exit %d, %q, %q", code, out, errOut)
	}
	sb, err := c.CreateSandbox(ctx, small)
	if err != nil {
		t.Fatalf("a create with a balance: %v", err)
	}
	created := time.Now()
	var warned bool
	var ended *client.Sandbox
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		b, err := c.Balance(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if !b.Billing {
			t.Fatal("billing is off")
		}
		warned = warned || b.WarnedAt != nil
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != client.StateRunning {
			ended = got
			break
		}
	}
	if ended == nil || ended.EndReason != meter.ReasonBalanceExhausted {
		t.Fatalf("the sandbox at zero: %+v", ended)
	}
	if lived := ended.EndedAt.Sub(created); !warned || lived < 5*time.Second {
		t.Errorf("stopped after %v (warned %v): want a warning first and about 6 s of credit used", lived, warned)
	}
	// Charged once its usage closed; the balance is spent.
	var b client.Balance
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if b, err = c.Balance(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if b.Running == "0" {
			break
		}
	}
	if b.Running != "0" || !strings.HasPrefix(b.Balance, "-") && b.Balance != "0" {
		t.Errorf("the balance after the stop: %+v", b)
	}
	es, err := c.Ledger(ctx, "", 0)
	if err != nil || len(es) != 2 || es[0].Kind != client.LedgerCharge || es[0].SandboxID != sb.ID || es[1].Kind != client.LedgerTopUp || es[1].Note != "test credit" {
		t.Fatalf("the ledger: %+v, %v", es, err)
	}
	if _, err := c.CreateSandbox(ctx, small); !client.IsInsufficientBalance(err) {
		t.Fatalf("a create after the balance ran out: %v", err)
	}
	// Topped up again, it creates.
	if _, err := s.admin.TopUp(ctx, team.ID, client.TopUpRequest{Amount: "1"}); err != nil {
		t.Fatal(err)
	}
	sb2, err := c.CreateSandbox(ctx, small)
	if err != nil {
		t.Fatalf("a create after a new top-up: %v", err)
	}
	if err := c.DeleteSandbox(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	// A team sees its own balance only; the admin sees any, and the top-up
	// is in the audit log.
	if _, err := other.Balance(ctx, team.ID); client.ErrorCode(err) != client.CodeForbidden {
		t.Errorf("another team's balance: %v", err)
	}
	if _, err := other.Ledger(ctx, team.ID, 0); client.ErrorCode(err) != client.CodeForbidden {
		t.Errorf("another team's ledger: %v", err)
	}
	if ob, err := s.admin.Balance(ctx, otherTeam.ID); err != nil || ob.Balance != "0" {
		t.Errorf("the admin's view of the other team: %+v, %v", ob, err)
	}
	out, _, code = runCLIOn(t, s, ctx, key, "", "balance", "ledger")
	if code != 0 || !strings.Contains(out, "test credit") || !strings.Contains(out, "charge") {
		t.Errorf("balance ledger: exit %d\n%s", code, out)
	}
	al, err := s.admin.ListAudit(ctx, client.AuditQuery{Action: client.AuditActionBalanceTopUp})
	if err != nil || len(al.Events) < 2 || al.Events[0].Target != team.ID {
		t.Errorf("the audit of the top-ups: %+v, %v", al, err)
	}
}
