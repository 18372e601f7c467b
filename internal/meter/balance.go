package meter

import (
	"context"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// ReasonBalanceExhausted is the end reason of a sandbox stopped because
// its team's balance ran out.
const ReasonBalanceExhausted = "balance_exhausted"

// Balance is a team's money: its ledger (top-ups and adjustments less the
// charges of its ended sandboxes) less what its sandboxes not charged yet
// (running, or ended since the last tick) have cost so far (their minimum
// included), in nano-units.
type Balance struct {
	Ledger, Running int64
	// WarnedAt is when the team was warned at zero (billing on), if it is.
	WarnedAt *time.Time
}

// Available is what the team has left.
func (b Balance) Available() int64 { return b.Ledger - b.Running }

// Balance returns teamID's balance.
func (m *Meter) Balance(ctx context.Context, teamID string) (Balance, error) {
	// The unbilled usage first, then the ledger: a charge committed in
	// between is then counted twice (the balance is low for a moment),
	// never missed.
	unbilled, err := m.st.UnbilledSegments(ctx, teamID)
	if err != nil {
		return Balance{}, err
	}
	sum, err := m.st.LedgerSum(ctx, teamID)
	if err != nil {
		return Balance{}, err
	}
	b := Balance{Ledger: sum}
	for _, one := range bySandbox(unbilled) {
		b.Running += m.life(one).Cost
	}
	m.mu.Lock()
	if at, ok := m.warned[teamID]; ok {
		b.WarnedAt = &at
	}
	m.mu.Unlock()
	return b, nil
}

// Admit refuses, with billing on, n creates whose minimum (each one's
// shape at its tariff's prices for the billing minimum, or one granule)
// the team's balance cannot cover: 402 insufficient_balance. Creates
// racing on one balance may each be admitted (the overdraft is bounded by
// their number and stopped at the next tick past the grace).
func (m *Meter) Admit(ctx context.Context, teamID string, t store.Tariff, cpu float64, memoryMB, diskMB, n int) error {
	if !m.cfg.Billing {
		return nil
	}
	rules := m.cfg.Rules.WithDefaults()
	least := max(rules.Minimum, rules.Granularity)
	need := int64(max(n, 1)) * cost(store.UsageSegment{CPU: cpu, MemoryMB: memoryMB, DiskMB: diskMB, PriceVCPUSecond: t.PriceVCPUSecond,
		PriceGiBSecond: t.PriceGiBSecond, PriceDiskGiBSecond: t.PriceDiskGiBSecond}, least, 0)
	b, err := m.Balance(ctx, teamID)
	if err != nil {
		return fmt.Errorf("billing: %w", err)
	}
	if have := b.Available(); have < need || have <= 0 {
		return &apierr.Error{Code: client.CodeInsufficientBalance,
			Message: fmt.Sprintf("the team's balance (%s) does not cover the minimum of %d sandbox(es) (%s for %s each at tariff %s); ask an admin to top it up",
				FormatMoney(have), max(n, 1), FormatMoney(need), least, t.Name)}
	}
	return nil
}

// enforce warns each team with running sandboxes whose balance is at or
// below zero, and stops its sandboxes once it stayed there for the grace.
func (m *Meter) enforce(ctx context.Context, now time.Time) error {
	unbilled, err := m.st.UnbilledSegments(ctx, "")
	if err != nil {
		return err
	}
	teams := map[string]bool{} // the teams with running sandboxes
	for _, u := range unbilled {
		if u.EndedAt == nil {
			teams[u.TeamID] = true
		}
	}
	m.mu.Lock()
	for team := range m.warned {
		if !teams[team] {
			delete(m.warned, team) // nothing of it runs any more
		}
	}
	m.mu.Unlock()
	for team := range teams {
		b, err := m.Balance(ctx, team)
		if err != nil {
			return err
		}
		m.mu.Lock()
		warnedAt, warned := m.warned[team]
		switch {
		case b.Available() > 0:
			delete(m.warned, team)
			m.mu.Unlock()
		case !warned:
			m.warned[team] = now
			m.mu.Unlock()
			m.log.Warn("balance_low: the team's balance is exhausted; its sandboxes stop after the grace unless it is topped up",
				"team", team, "balance", FormatMoney(b.Available()), "grace", m.cfg.Grace)
		case now.Sub(warnedAt) >= m.cfg.Grace:
			m.mu.Unlock()
			n, err := m.stop.EndTeam(ctx, team, ReasonBalanceExhausted)
			if err != nil {
				return err
			}
			m.mu.Lock()
			if m.metrics != nil {
				m.metrics.stopped.Add(float64(n))
			}
			m.mu.Unlock()
			m.log.Warn("balance_exhausted: the team's sandboxes were stopped", "team", team, "sandboxes", n)
		default:
			m.mu.Unlock()
		}
	}
	return nil
}
