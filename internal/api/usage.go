package api

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"time"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// Metering is what the API needs of the store for tariffs and usage.
type Metering interface {
	PutTariff(ctx context.Context, t store.Tariff) (bool, error)
	GetTariff(ctx context.Context, name string) (store.Tariff, error)
	ListTariffs(ctx context.Context) ([]store.Tariff, error)
	DeleteTariff(ctx context.Context, name string) error
	UsageSegments(ctx context.Context, teamID string, from, to time.Time) ([]store.UsageSegment, error)
	AddLedger(ctx context.Context, e store.LedgerEntry) (store.LedgerEntry, error)
	ListLedger(ctx context.Context, teamID string, limit int) ([]store.LedgerEntry, error)
}

// tariffName is what a tariff may be called.
var tariffName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// defaultUsageWindow is the window of GET /v1/usage without from.
const defaultUsageWindow = 30 * 24 * time.Hour

// noMetering answers 501 when the server keeps no tariffs nor usage.
func (s *Server) noMetering(w http.ResponseWriter) bool {
	if s.metering == nil || s.meter == nil {
		writeError(w, errorf(client.CodeNotImplemented, "this server does not meter usage"))
		return true
	}
	return false
}

func tariffOut(t store.Tariff) client.Tariff {
	out := client.Tariff{Name: t.Name, CPU: t.CPU, MemoryMB: t.MemoryMB, DiskMB: t.DiskMB,
		PriceVCPUSecond: meter.FormatMoney(t.PriceVCPUSecond), PriceGiBSecond: meter.FormatMoney(t.PriceGiBSecond),
		PriceDiskGiBSecond: meter.FormatMoney(t.PriceDiskGiBSecond), CPUAbuseThreshold: t.CPUAbuseThreshold,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
	if t.CPUAbuseWindow != nil {
		w := t.CPUAbuseWindow.Seconds()
		out.CPUAbuseWindowSeconds = &w
	}
	return out
}

func (s *Server) listTariffs(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	if s.noMetering(w) {
		return
	}
	ts, err := s.metering.ListTariffs(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := client.TariffList{Tariffs: make([]client.Tariff, 0, len(ts))}
	for _, t := range ts {
		out.Tariffs = append(out.Tariffs, tariffOut(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getTariff(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	if s.noMetering(w) {
		return
	}
	t, err := s.metering.GetTariff(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, storeErr(err, "tariff "+r.PathValue("name")))
		return
	}
	writeJSON(w, http.StatusOK, tariffOut(t))
}

func (s *Server) putTariff(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if s.noMetering(w) {
		return
	}
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	name := r.PathValue("name")
	if !tariffName.MatchString(name) {
		writeError(w, errorf(client.CodeBadRequest, "tariff name %q is not valid: lower-case letters, digits, '.', '_' and '-', at most 63", name))
		return
	}
	var req client.PutTariffRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	t := store.Tariff{Name: name, CPU: req.CPU, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, CPUAbuseThreshold: req.CPUAbuseThreshold}
	if th := req.CPUAbuseThreshold; th != nil && (*th <= 0 || *th > 1) {
		writeError(w, errorf(client.CodeBadRequest, "cpu_abuse_threshold must be above 0 and at most 1, got %g", *th))
		return
	}
	if ws := req.CPUAbuseWindowSeconds; ws != nil {
		if *ws < 0 || *ws > limits.MaxTimeout.Seconds() {
			writeError(w, errorf(client.CodeBadRequest, "cpu_abuse_window_seconds must be between 0 (no rule) and %g, got %g", limits.MaxTimeout.Seconds(), *ws))
			return
		}
		d := time.Duration(*ws * float64(time.Second))
		t.CPUAbuseWindow = &d
	}
	if req.CPU < 0.1 || req.CPU > 1024 || req.MemoryMB < 32 || req.MemoryMB > 1<<20 || req.DiskMB < 16 || req.DiskMB > 1<<24 {
		writeError(w, errorf(client.CodeBadRequest, "a tariff needs cpu 0.1–1024, memory_mb 32–1048576 and disk_mb 16–16777216"))
		return
	}
	for _, f := range []struct {
		name string
		in   string
		out  *int64
	}{{"price_vcpu_second", req.PriceVCPUSecond, &t.PriceVCPUSecond}, {"price_gib_second", req.PriceGiBSecond, &t.PriceGiBSecond},
		{"price_disk_gib_second", req.PriceDiskGiBSecond, &t.PriceDiskGiBSecond}} {
		v, err := meter.ParseMoney(f.in)
		if err == nil && v > meter.MaxPrice {
			err = fmt.Errorf("at most %s a second", meter.FormatMoney(meter.MaxPrice))
		}
		if err != nil {
			writeError(w, errorf(client.CodeBadRequest, "%s: %v", f.name, err))
			return
		}
		*f.out = v
	}
	created, err := s.metering.PutTariff(r.Context(), t)
	if err != nil {
		writeError(w, err)
		return
	}
	setTarget(r.Context(), name)
	got, err := s.metering.GetTariff(r.Context(), name)
	if err != nil {
		writeError(w, storeErr(err, "tariff "+name))
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, tariffOut(got))
}

func (s *Server) deleteTariff(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if s.noMetering(w) {
		return
	}
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	if name := r.PathValue("name"); name == s.defaultTariff {
		writeError(w, errorf(client.CodeConflict, "tariff %s is the server's default tariff (serve --default-tariff): the sandboxes created without a tariff are priced by it", name))
		return
	}
	if err := s.metering.DeleteTariff(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, storeErr(err, "tariff "+r.PathValue("name")))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if s.noMetering(w) {
		return
	}
	q := r.URL.Query()
	now := time.Now().UTC()
	to, from := now, now.Add(-defaultUsageWindow)
	for _, f := range []struct {
		name string
		into *time.Time
	}{{"from", &from}, {"to", &to}} {
		if v := q.Get(f.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				writeError(w, errorf(client.CodeBadRequest, "%s must be an RFC 3339 time (2026-12-01T00:00:00Z), got %q", f.name, v))
				return
			}
			*f.into = t.UTC()
		}
	}
	if q.Get("to") != "" && q.Get("from") == "" {
		from = to.Add(-defaultUsageWindow)
	}
	if !from.Before(to) {
		writeError(w, errorf(client.CodeBadRequest, "from must be before to"))
		return
	}
	groupBy := q.Get("group_by")
	if groupBy == "" {
		groupBy = meter.ByTariff
	}
	if !meter.ValidGroupBy(groupBy) {
		writeError(w, errorf(client.CodeBadRequest, "group_by must be sandbox, template, tariff, day or eval_run, got %q", groupBy))
		return
	}
	team := p.TeamID
	if t := q.Get("team"); t != "" && t != p.TeamID {
		if err := requireAdmin(p); err != nil {
			writeError(w, errorf(client.CodeForbidden, "the usage of another team needs an admin key"))
			return
		}
		team = t
		if t == "all" {
			team = ""
		}
	}
	segs, err := s.metering.UsageSegments(r.Context(), team, from, to)
	if err != nil {
		writeError(w, err)
		return
	}
	lines, total := meter.Report(segs, from, to, groupBy, s.meter.Rules())
	rules := s.meter.Rules().WithDefaults()
	out := client.UsageReport{From: from, To: to, GroupBy: groupBy, TeamID: team, Groups: make([]client.UsageLine, 0, len(lines)),
		Total: lineOut(total), GranularitySeconds: rules.Granularity.Seconds(), MinimumSeconds: max(rules.Minimum, 0).Seconds()}
	for _, l := range lines {
		out.Groups = append(out.Groups, lineOut(l))
	}
	writeJSON(w, http.StatusOK, out)
}

func lineOut(l meter.Line) client.UsageLine {
	return client.UsageLine{Key: l.Key, Sandboxes: l.Sandboxes, RunningSeconds: l.Running.Seconds(), PausedSeconds: l.Paused.Seconds(),
		BilledSeconds: l.Billed.Seconds(), BilledPausedSeconds: l.BilledPaused.Seconds(), VCPUSeconds: l.VCPUSeconds,
		GiBSeconds: l.GiBSeconds, Cost: meter.FormatMoney(l.Cost)}
}
