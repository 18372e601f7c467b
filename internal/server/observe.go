package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/evalbox/evalbox/internal/api"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/internal/evalrun"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// DefaultAuditRetention is serve --audit-retention's default.
const DefaultAuditRetention = 90 * 24 * time.Hour

// registerMetrics makes the server's registry (no global one: a test's
// servers in one process keep theirs apart) and has every package put its
// metrics on it, with the Go runtime's and the process's. It returns the
// trial metrics the API's trial runner shares with the eval runs'.
//
// The meter's usage counters are on it too (meter.RegisterMetrics).
func registerMetrics(svc *sandbox.Service, tmpls *catalog.Service, evals *evalrun.Service, mtr *meter.Meter) (*prometheus.Registry, *trial.Metrics, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, err
	}
	trials, err := trial.NewMetrics(reg)
	if err != nil {
		return nil, nil, err
	}
	err = errors.Join(svc.RegisterMetrics(reg), tmpls.RegisterMetrics(reg), evals.RegisterMetrics(reg, trials), mtr.RegisterMetrics(reg))
	if err != nil {
		return nil, nil, err
	}
	return reg, trials, nil
}

// AuditStore is what the retention sweep needs of the store.
type AuditStore interface {
	DeleteAuditBefore(ctx context.Context, t time.Time) (int64, error)
}

// auditSweepInterval is how often rows past the retention are deleted.
const auditSweepInterval = time.Hour

// startObservability serves the registry on cfg.MetricsListen (without
// authentication: bind it to a private address) and sweeps the audit log
// of rows older than cfg.AuditRetention (none when 0), at once and every
// hour, until the returned stop is called.
func startObservability(cfg Config, reg *prometheus.Registry, st AuditStore, log *slog.Logger) (stop func(), err error) {
	var srv *http.Server
	if cfg.MetricsListen != "" {
		ln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return nil, fmt.Errorf("server: --metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", api.MetricsHandler(reg))
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics listener", "err", err)
			}
		}()
		log.Info("metrics serving (unauthenticated: keep this address private)", "addr", ln.Addr().String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if cfg.AuditRetention <= 0 {
			return
		}
		t := time.NewTicker(auditSweepInterval)
		defer t.Stop()
		for {
			sweepAudit(ctx, st, cfg.AuditRetention, log)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
		if srv != nil {
			_ = srv.Close()
		}
	}, nil
}

// sweepAudit deletes the audit rows older than retention.
func sweepAudit(ctx context.Context, st AuditStore, retention time.Duration, log *slog.Logger) {
	n, err := st.DeleteAuditBefore(ctx, time.Now().Add(-retention))
	switch {
	case err != nil && ctx.Err() == nil:
		log.Error("audit: deleting rows past the retention", "err", err)
	case n > 0:
		log.Info("audit: deleted rows past the retention", "rows", n, "retention", retention)
	}
}
