package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

type tariffsOf []store.Tariff

func (t *tariffsOf) ListTariffs(context.Context) ([]store.Tariff, error) { return *t, nil }

// TestTariffAbuseLimits: a tariff's own threshold and window, each the
// server's where it has none; no tariff or one without a rule: the server's.
func TestTariffAbuseLimits(t *testing.T) {
	half, minute, zero := 0.5, time.Minute, time.Duration(0)
	ts := &tariffsOf{{Name: "strict", CPUAbuseThreshold: &half, CPUAbuseWindow: &minute}, {Name: "exempt", CPUAbuseWindow: &zero}, {Name: "plain"}}
	limits := tariffAbuseLimits(ts, 0.9, 15*time.Minute, time.Hour, slog.Default())
	for tariff, want := range map[string]struct {
		th float64
		w  time.Duration
		ok bool
	}{"strict": {0.5, time.Minute, true}, "exempt": {0.9, 0, true}, "plain": {0, 0, false}, "": {0, 0, false}, "gone": {0, 0, false}} {
		th, w, ok := limits(client.Sandbox{Tariff: tariff})
		if th != want.th || w != want.w || ok != want.ok {
			t.Errorf("tariff %q: %v %v %v, want %+v", tariff, th, w, ok, want)
		}
	}
	// Read again only after the refresh.
	*ts = nil
	if _, _, ok := limits(client.Sandbox{Tariff: "strict"}); !ok {
		t.Error("the tariffs were read again before the refresh")
	}
}
