package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// teamStopper is the meter's meter.Stopper: the sandbox service's EndTeam,
// through a function since the service is made after the meter it uses.
type teamStopper func(ctx context.Context, teamID, reason string) (int, error)

func (f teamStopper) EndTeam(ctx context.Context, teamID, reason string) (int, error) {
	return f(ctx, teamID, reason)
}

// tariffLister lists the tariffs (internal/store does).
type tariffLister interface {
	ListTariffs(ctx context.Context) ([]store.Tariff, error)
}

// tariffAbuseLimits is the CPU-abuse rule's per-tariff seam
// (sandbox.CPUAbuseConfig.Limits): a sandbox's tariff's own threshold and
// window, each the server's where the tariff has none. The tariffs are
// read at most every refresh (the rule samples every sandbox each
// interval); a tariff's change applies within it.
func tariffAbuseLimits(st tariffLister, threshold float64, window, refresh time.Duration, log *slog.Logger) func(client.Sandbox) (float64, time.Duration, bool) {
	var (
		mu      sync.Mutex
		byName  map[string]store.Tariff
		fetched time.Time
	)
	return func(row client.Sandbox) (float64, time.Duration, bool) {
		if row.Tariff == "" {
			return 0, 0, false
		}
		mu.Lock()
		defer mu.Unlock()
		if byName == nil || time.Since(fetched) > refresh {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ts, err := st.ListTariffs(ctx)
			cancel()
			if err != nil {
				log.Warn("cpu-abuse rule: reading the tariffs", "err", err)
			} else {
				byName, fetched = make(map[string]store.Tariff, len(ts)), time.Now()
				for _, t := range ts {
					byName[t.Name] = t
				}
			}
		}
		t, ok := byName[row.Tariff]
		if !ok || (t.CPUAbuseThreshold == nil && t.CPUAbuseWindow == nil) {
			return 0, 0, false
		}
		th, w := threshold, window
		if t.CPUAbuseThreshold != nil {
			th = *t.CPUAbuseThreshold
		}
		if t.CPUAbuseWindow != nil {
			w = *t.CPUAbuseWindow
		}
		return th, w, true
	}
}
