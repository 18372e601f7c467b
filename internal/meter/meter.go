package meter

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/store"
)

// DefaultInterval is how often the meter ticks: what a crash of every
// server may lose of a running sandbox's usage, at most.
const DefaultInterval = limits.MeterInterval

// DefaultGrace is how long a team's sandboxes run on after its balance
// reached zero (and it was warned), with billing on.
const DefaultGrace = 30 * time.Second

// Store is what the meter needs of the store.
type Store interface {
	AccrueUsage(ctx context.Context, now time.Time) (int64, error)
	UnchargedSegments(ctx context.Context, limit int) ([]store.UsageSegment, error)
	Charge(ctx context.Context, teamID, sandboxID string, cost int64) (bool, error)
	UnbilledSegments(ctx context.Context, teamID string) ([]store.UsageSegment, error)
	LedgerSum(ctx context.Context, teamID string) (int64, error)
}

// Stopper stops a team's running sandboxes (the sandbox service does).
type Stopper interface {
	EndTeam(ctx context.Context, teamID, reason string) (int, error)
}

// Config configures a Meter.
type Config struct {
	// Interval is the tick (0: DefaultInterval).
	Interval time.Duration
	Rules    Rules
	// Billing on: creates a team's balance cannot cover are refused
	// (Admit), and at zero its running sandboxes are warned, then stopped
	// after Grace (0: DefaultGrace) with the reason balance_exhausted.
	// Off: usage and balances are kept and shown, nothing is refused.
	Billing bool
	Grace   time.Duration
}

// Meter ticks the usage, charges ended sandboxes to their teams' ledgers
// and, with billing on, holds teams to their balance.
type Meter struct {
	st   Store
	cfg  Config
	log  *slog.Logger
	stop Stopper

	mu sync.Mutex
	// warned is when each team at zero was warned (billing on).
	warned map[string]time.Time
	// metrics, once registered (RegisterMetrics).
	metrics *metrics
}

// New returns a meter over st; stop ends teams' sandboxes (billing on).
func New(st Store, stop Stopper, cfg Config, log *slog.Logger) *Meter {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if log == nil {
		log = slog.Default()
	}
	return &Meter{st: st, cfg: cfg, log: log, stop: stop, warned: map[string]time.Time{}}
}

// Rules are the meter's billing rules.
func (m *Meter) Rules() Rules { return m.cfg.Rules }

// Billing reports whether billing is on.
func (m *Meter) Billing() bool { return m.cfg.Billing }

// Run ticks until ctx ends. Start it after the sandbox service's Recover:
// a sandbox that died with the last server must be closed where the last
// tick left it, not advanced to now.
func (m *Meter) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m.Tick(ctx, now)
		}
	}
}

// Tick advances the open usage to now, charges the sandboxes that ended,
// and, with billing on, enforces the teams' balances.
func (m *Meter) Tick(ctx context.Context, now time.Time) {
	if _, err := m.st.AccrueUsage(ctx, now); err != nil {
		if ctx.Err() == nil {
			m.log.Warn("metering: advancing usage", "err", err)
		}
		return
	}
	if err := m.charge(ctx); err != nil && ctx.Err() == nil {
		m.log.Warn("metering: charging ended sandboxes", "err", err)
	}
	if m.cfg.Billing {
		if err := m.enforce(ctx, now); err != nil && ctx.Err() == nil {
			m.log.Warn("billing: enforcing balances", "err", err)
		}
	}
}

// charge writes the final cost of each ended, uncharged sandbox into its
// team's ledger.
func (m *Meter) charge(ctx context.Context) error {
	for {
		segs, err := m.st.UnchargedSegments(ctx, 500)
		if err != nil || len(segs) == 0 {
			return err
		}
		m.mu.Lock()
		mm := m.metrics
		m.mu.Unlock()
		var failed error
		for _, one := range bySandbox(segs) {
			life := m.life(one)
			charged, err := m.st.Charge(ctx, one[0].TeamID, one[0].SandboxID, life.Cost)
			if err != nil {
				// The others are charged still; this one is tried again
				// at the next tick.
				failed = err
				continue
			}
			if charged {
				mm.charged(one[0].Tariff, life)
			}
		}
		if failed != nil || len(segs) < 500 {
			return failed
		}
	}
}

// life is a sandbox's whole life (its segments), billed: the minimum
// included.
func (m *Meter) life(segs []store.UsageSegment) Line {
	from := segs[0].StartedAt
	to := from
	for _, u := range segs {
		from, to = earlier(from, u.StartedAt), later(to, u.End())
	}
	_, total := Report(segs, from, to.Add(time.Microsecond), BySandbox, m.cfg.Rules)
	return total
}

// bySandbox splits segments ordered by sandbox into each sandbox's.
func bySandbox(segs []store.UsageSegment) [][]store.UsageSegment {
	var out [][]store.UsageSegment
	for i := 0; i < len(segs); {
		j := i
		for j < len(segs) && segs[j].SandboxID == segs[i].SandboxID {
			j++
		}
		out = append(out, segs[i:j])
		i = j
	}
	return out
}
