package api

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpMetrics are the API's own series (docs/observability.md). Their
// labels are bounded: a route is the mux's pattern without its method
// (never a path with ids in it), a code one of pkg/client's Code*.
type httpMetrics struct {
	requests *prometheus.CounterVec   // route, method, status
	duration *prometheus.HistogramVec // route, method
	errors   *prometheus.CounterVec   // code
}

func newHTTPMetrics() *httpMetrics {
	return &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_http_requests_total",
			Help: "HTTP requests served, by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "evalbox_http_request_duration_seconds",
			Help: "Time to serve an HTTP request (a stream's whole length), by route pattern and method.",
			// From a health check to a long exec or stream.
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"route", "method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_http_errors_total",
			Help: "Error answers of evalbox's own API, by error code (the Evalbox-Error header).",
		}, []string{"code"}),
	}
}

func (m *httpMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.errors} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Routes of requests the mux does not route (no pattern): E2B's sandbox
// traffic (by header) and the host form of port URLs.
const (
	routeSandboxTraffic = "(sandbox traffic)"
	routePortHost       = "(port host)"
	routeUnknown        = "(none)"
)

// routeLabel is a request's route as a metric label: the mux's pattern
// without its method ("/v1/sandboxes/{id}").
func routeLabel(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return routeUnknown
	}
	if _, path, ok := strings.Cut(p, " "); ok {
		return path
	}
	return p
}

// methodLabel bounds the method label to the methods HTTP defines.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "other"
}

// countRequest counts a request in the server's metrics.
func (s *Server) countRequest(r *http.Request, route string, status int, code string, took time.Duration) {
	m := s.metrics
	method := methodLabel(r.Method)
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route, method).Observe(took.Seconds())
	if code != "" {
		if len(code) > 40 { // codes are pkg/client's; never a free text
			code = "other"
		}
		m.errors.WithLabelValues(code).Inc()
	}
}

// serveMetrics is GET /metrics on the API's listener: an admin key's only
// (a separate listener, serve --metrics-listen, serves MetricsHandler to
// whoever reaches it).
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	if s.gatherer == nil {
		writeError(w, errorf(client.CodeNotFound, "this server keeps no metrics"))
		return
	}
	s.metricsHandler.ServeHTTP(w, r)
}

// MetricsHandler serves the registry in Prometheus's text format, to
// anyone: for a listener of its own on a private address.
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
