package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// Tariffs looks tariffs up by name (internal/store does).
type Tariffs interface {
	GetTariff(ctx context.Context, name string) (store.Tariff, error)
}

// DefaultTariff is the tariff of a sandbox created without one.
const DefaultTariff = meter.DefaultTariff

// tariffOf resolves a create's tariff: the one it names (an unknown name is
// 400), or the server's default (which only prices: the shape stays the
// template's). ok is false when the default does not exist (deleted by an
// admin): the sandbox is then recorded with no tariff, unpriced.
func (s *Service) tariffOf(ctx context.Context, name string) (t store.Tariff, named, ok bool, err error) {
	if s.cfg.Tariffs == nil {
		return store.Tariff{}, false, false, nil
	}
	named = name != ""
	if !named {
		name = s.cfg.DefaultTariff
		if name == "" {
			name = DefaultTariff
		}
	}
	t, err = s.tariff(ctx, name)
	switch {
	case errors.Is(err, store.ErrNotFound) && named:
		return store.Tariff{}, true, false, errorf(client.CodeBadRequest, "tariff %q does not exist (GET /v1/tariffs lists them)", name)
	case errors.Is(err, store.ErrNotFound):
		return store.Tariff{}, false, false, nil
	case err != nil:
		return store.Tariff{}, named, false, fmt.Errorf("sandbox: tariff %s: %w", name, err)
	}
	return t, named, true, nil
}

// tariffTTL is how long a tariff read is kept: a tariff's change applies
// to creates (and to the CPU-abuse rule) within it.
const tariffTTL = 5 * time.Second

// cachedTariff is a tariff as read (err: store.ErrNotFound, kept too).
type cachedTariff struct {
	t   store.Tariff
	err error
	at  time.Time
}

// tariff returns the tariff of this name, cached for tariffTTL: creates
// read it on their path, the CPU-abuse rule for every sandbox it samples.
func (s *Service) tariff(ctx context.Context, name string) (store.Tariff, error) {
	s.tariffMu.Lock()
	c, ok := s.tariffCache[name]
	s.tariffMu.Unlock()
	if ok && time.Since(c.at) < tariffTTL {
		return c.t, c.err
	}
	t, err := s.cfg.Tariffs.GetTariff(ctx, name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return store.Tariff{}, err // not kept: the next call reads again
	}
	s.tariffMu.Lock()
	s.tariffCache[name] = cachedTariff{t: t, err: err, at: time.Now()}
	s.tariffMu.Unlock()
	return t, err
}

// tariffAbuseLimits is CPUAbuseConfig.Limits when the service has
// tariffs: a sandbox's tariff's own CPU-abuse threshold and window, each
// the server's where the tariff has none (ok false: none of its own).
func (s *Service) tariffAbuseLimits(row client.Sandbox) (float64, time.Duration, bool) {
	if row.Tariff == "" {
		return 0, 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t, err := s.tariff(ctx, row.Tariff)
	if err != nil || (t.CPUAbuseThreshold == nil && t.CPUAbuseWindow == nil) {
		return 0, 0, false
	}
	th, w := s.cfg.CPUAbuse.Threshold, s.cfg.CPUAbuse.Window
	if t.CPUAbuseThreshold != nil {
		th = *t.CPUAbuseThreshold
	}
	if t.CPUAbuseWindow != nil {
		w = *t.CPUAbuseWindow
	}
	return th, w, true
}

// applyTariff sets shape from a named tariff: each of cpu, memory_mb and
// disk_mb the request left unset is the tariff's, one it set may be lower
// than the tariff's, never higher. It also refuses a tariff larger than
// this server's per-sandbox maxima.
func (s *Service) applyTariff(t store.Tariff, req client.CreateSandboxRequest, shape *nodeapi.Shape) error {
	if t.CPU > s.cfg.MaxCPU || t.MemoryMB > s.cfg.MaxMemoryMB || t.DiskMB > s.cfg.MaxDiskMB {
		return errorf(client.CodeBadRequest, "tariff %s (%g vCPU, %d MB, %d MB disk) is larger than this server's sandboxes may be (%g, %d, %d)",
			t.Name, t.CPU, t.MemoryMB, t.DiskMB, s.cfg.MaxCPU, s.cfg.MaxMemoryMB, s.cfg.MaxDiskMB)
	}
	if req.CPU > t.CPU {
		return errorf(client.CodeBadRequest, "cpu %g is above tariff %s's %g", req.CPU, t.Name, t.CPU)
	}
	if req.MemoryMB > t.MemoryMB {
		return errorf(client.CodeBadRequest, "memory_mb %d is above tariff %s's %d", req.MemoryMB, t.Name, t.MemoryMB)
	}
	if req.DiskMB > t.DiskMB {
		return errorf(client.CodeBadRequest, "disk_mb %d is above tariff %s's %d", req.DiskMB, t.Name, t.DiskMB)
	}
	if req.CPU == 0 {
		shape.CPU = t.CPU
	}
	if req.MemoryMB == 0 {
		shape.MemoryMB = t.MemoryMB
	}
	if req.DiskMB == 0 {
		shape.DiskMB = t.DiskMB
	}
	return nil
}

// Billing admits creates against their team's balance (a meter.Meter
// does): a create the balance cannot cover is a *apierr.Error (402
// insufficient_balance).
type Billing interface {
	Admit(ctx context.Context, teamID string, t store.Tariff, cpu float64, memoryMB, diskMB, n int) error
}

// admitBilling asks the billing, if any, whether the team can pay for n
// sandboxes of this shape at its tariff.
func (s *Service) admitBilling(ctx context.Context, teamID string, t store.Tariff, priced bool, shape nodeapi.Shape, n int) error {
	if s.cfg.Billing == nil || !priced {
		return nil
	}
	return s.cfg.Billing.Admit(ctx, teamID, t, shape.CPU, shape.MemoryMB, shape.DiskMB, n)
}

// EndTeam stops every running (and paused) sandbox of a team with reason
// (the billing's balance_exhausted), and returns how many it stopped.
func (s *Service) EndTeam(ctx context.Context, teamID, reason string) (int, error) {
	rows, err := s.List(ctx, teamID, nil, false)
	if err != nil {
		return 0, err
	}
	var es []*entry
	for _, row := range rows {
		if e := s.entryOf(row); e != nil {
			es = append(es, e)
		}
	}
	s.endAll(ctx, es, client.StateDeleted, reason)
	return len(es), nil
}
