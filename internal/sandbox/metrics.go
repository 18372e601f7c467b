package sandbox

import (
	"cmp"
	"context"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
	"github.com/prometheus/client_golang/prometheus"
)

// The service's metrics (docs/observability.md). Observations go to
// collectors made in New, counted whether or not RegisterMetrics put them
// on a registry. Labels are bounded: runtimes, states, error codes, and
// template names capped at maxTemplateLabels per scrape; never a team or
// a sandbox id.
type metrics struct {
	create    *prometheus.HistogramVec // runtime, outcome, from_pool
	exec      *prometheus.HistogramVec // runtime, status
	ended     *prometheus.CounterVec   // state
	claims    *prometheus.CounterVec   // template, runtime
	queueWait *prometheus.HistogramVec // queue
}

// latencyBuckets cover a warm-pool claim (ms) to a queued cold start.
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

func newMetrics() *metrics {
	return &metrics{
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "evalbox_sandbox_create_duration_seconds",
			Help:    "Time a sandbox create took (validation, admission waits, start), by runtime, outcome (ok or the error code) and whether a warm pool served it.",
			Buckets: latencyBuckets,
		}, []string{"runtime", "outcome", "from_pool"}),
		exec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "evalbox_exec_duration_seconds",
			Help:    "Time an exec took to complete (its slot's wait included), by runtime and status (exited, timed_out, killed, or error when it failed).",
			Buckets: latencyBuckets,
		}, []string{"runtime", "status"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_sandboxes_ended_total",
			Help: "Sandboxes this replica recorded as ended, by final state (deleted, expired, lost).",
		}, []string{"state"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "evalbox_pool_claims_total",
			Help: "Creates served by a warm-pool sandbox, by template and runtime.",
		}, []string{"template", "runtime"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "evalbox_queue_wait_seconds",
			Help:    "Time a request waited for a team slot: sandbox_slot (a create at the team's max_sandboxes, queued by wait_seconds) or exec_slot (an exec at max_concurrent_execs).",
			Buckets: []float64{.001, .01, .1, .5, 1, 5, 10, 30, 60, 300, 600},
		}, []string{"queue"}),
	}
}

// Queues of evalbox_queue_wait_seconds.
const (
	queueSandboxSlot = "sandbox_slot"
	queueExecSlot    = "exec_slot"
)

// maxTemplateLabels bounds the template label of evalbox_sandboxes: past
// it, the smallest counts are summed as "other".
const maxTemplateLabels = 50

// RegisterMetrics puts the service's metrics on reg, with a collector
// that reads, at each scrape, the running sandboxes from the store (every
// replica's: the same on each replica of a fleet) and the node's pools
// and host capacity (a fleet's summed).
func (s *Service) RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{s.m.create, s.m.exec, s.m.ended, s.m.claims, s.m.queueWait, &stateCollector{s: s}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// runtimeLabel bounds a runtime label to the runtimes evalbox has.
func runtimeLabel(rt string) string {
	switch rt {
	case client.RuntimeGVisor, client.RuntimeNamespaces:
		return rt
	}
	return "other"
}

// outcomeLabel is a call's outcome: "ok", or its error's code.
func outcomeLabel(err error) string {
	if err == nil {
		return "ok"
	}
	return cmp.Or(apierr.Code(err), client.CodeInternal)
}

// Create validates req, admits it against the team's active-sandbox limit
// (queueing up to req.WaitSeconds), starts the sandbox and records it. It
// returns once the sandbox's agent answers; on error nothing is left.
func (s *Service) Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	start := time.Now()
	sb, err := s.create(ctx, teamID, req)
	rt := sb.Runtime
	if err != nil {
		rt = cmp.Or(req.Runtime, s.cfg.DefaultRuntime)
	}
	s.m.create.WithLabelValues(runtimeLabel(rt), outcomeLabel(err), strconv.FormatBool(sb.FromPool)).Observe(time.Since(start).Seconds())
	if err == nil && sb.FromPool {
		s.m.claims.WithLabelValues(sb.Template, runtimeLabel(sb.Runtime)).Inc()
	}
	return sb, err
}

// Exec runs a command to completion in a sandbox of the team, writing its
// stdout and stderr to the writers as they come.
func (s *Service) Exec(ctx context.Context, teamID, id string, req client.ExecRequest, stdout, stderr io.Writer) (client.ExecResult, error) {
	start := time.Now()
	res, rt, err := s.execute(ctx, teamID, id, req, stdout, stderr)
	status := res.Status
	if err != nil {
		status = client.StatusError
	}
	switch status {
	case client.StatusExited, client.StatusTimedOut, client.StatusKilled, client.StatusError:
	default:
		status = "other"
	}
	s.m.exec.WithLabelValues(runtimeLabel(rt), status).Observe(time.Since(start).Seconds())
	return res, err
}

// waited observes a wait for a team slot.
func (s *Service) waited(queue string, since time.Time) {
	s.m.queueWait.WithLabelValues(queue).Observe(time.Since(since).Seconds())
}

// runningCounter is the store's count of running sandboxes
// (*store.Store); a store without it reports none.
type runningCounter interface {
	CountRunning(ctx context.Context) ([]store.SandboxCount, error)
}

// stateCollector reports what is running now, read at each scrape.
type stateCollector struct {
	s *Service
	// last holds the previous scrape's evalbox_sandboxes series: one that
	// has gone is reported once more, at 0, so that a graph drops to 0
	// before the series goes stale.
	mu   sync.Mutex
	last map[sandboxKey]int
}

var (
	sandboxesDesc = prometheus.NewDesc("evalbox_sandboxes",
		"Running sandboxes now (every replica's, from the database), by state (running or paused), runtime and template name.",
		[]string{"state", "runtime", "template"}, nil)
	poolTargetDesc = prometheus.NewDesc("evalbox_pool_target",
		"Warm-pool sandboxes a pool is kept at, by template and runtime.", []string{"template", "runtime"}, nil)
	poolReadyDesc = prometheus.NewDesc("evalbox_pool_ready",
		"Warm-pool sandboxes ready to be claimed now, by template and runtime.", []string{"template", "runtime"}, nil)
	capacityDesc = prometheus.NewDesc("evalbox_host_capacity",
		"The nodes' host capacity sandboxes are admitted against, by resource (pids, memory_bytes) and kind (budget, reserved).",
		[]string{"resource", "kind"}, nil)
	capacityWaitingDesc = prometheus.NewDesc("evalbox_host_capacity_waiting",
		"Creates queued for host capacity now (wait_seconds).", nil, nil)
	scrapeErrorsDesc = prometheus.NewDesc("evalbox_metrics_scrape_errors",
		"Sources this scrape could not read (1 each): store, pools, capacity.", []string{"source"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, poolTargetDesc, poolReadyDesc, capacityDesc, capacityWaitingDesc, scrapeErrorsDesc} {
		ch <- d
	}
}

// scrapeTimeout bounds what one scrape spends on each source.
const scrapeTimeout = 5 * time.Second

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	failed := func(source string, err error) {
		c.s.log.Warn("metrics: reading "+source, "err", err)
		ch <- prometheus.MustNewConstMetric(scrapeErrorsDesc, prometheus.GaugeValue, 1, source)
	}
	if rc, ok := c.s.store.(runningCounter); ok {
		if counts, err := rc.CountRunning(ctx); err != nil {
			failed("store", err)
		} else {
			series := sandboxSeries(counts)
			c.mu.Lock()
			for k := range c.last {
				if _, ok := series[k]; !ok {
					ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, 0, k.state, k.runtime, k.template)
				}
			}
			c.last = series
			c.mu.Unlock()
			for k, n := range series {
				ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k.state, k.runtime, k.template)
			}
		}
	}
	if pools, err := c.s.node.Pools(ctx); err != nil {
		failed("pools", err)
	} else {
		for _, p := range pools {
			name := cmp.Or(p.TemplateName, p.Spec.Template)
			rt := runtimeLabel(p.Spec.Runtime)
			ch <- prometheus.MustNewConstMetric(poolTargetDesc, prometheus.GaugeValue, float64(p.Target), name, rt)
			ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(p.Ready), name, rt)
		}
	}
	if st, err := c.s.node.Capacity(ctx); err != nil {
		failed("capacity", err)
	} else {
		for _, v := range []struct {
			resource, kind string
			n              int64
		}{
			{"pids", "budget", st.Budget.Pids}, {"pids", "reserved", st.Reserved.Pids},
			{"memory_bytes", "budget", st.Budget.MemoryBytes}, {"memory_bytes", "reserved", st.Reserved.MemoryBytes},
		} {
			ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(v.n), v.resource, v.kind)
		}
		ch <- prometheus.MustNewConstMetric(capacityWaitingDesc, prometheus.GaugeValue, float64(st.Waiting))
	}
}

type sandboxKey struct{ state, runtime, template string }

// sandboxSeries turns the store's counts into evalbox_sandboxes's series:
// the maxTemplateLabels templates with the most sandboxes by name, the
// rest as "other".
func sandboxSeries(counts []store.SandboxCount) map[sandboxKey]int {
	byTemplate := map[string]int{}
	for _, c := range counts {
		byTemplate[c.Template] += c.N
	}
	names := make([]string, 0, len(byTemplate))
	for n := range byTemplate {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(byTemplate[b], byTemplate[a]), cmp.Compare(a, b))
	})
	kept := map[string]bool{}
	for _, n := range names[:min(len(names), maxTemplateLabels)] {
		kept[n] = true
	}
	out := map[sandboxKey]int{}
	for _, c := range counts {
		k := sandboxKey{state: client.StateRunning, runtime: runtimeLabel(c.Runtime), template: c.Template}
		if c.Paused {
			k.state = client.StatePaused
		}
		if !kept[k.template] {
			k.template = "other"
		}
		out[k] += c.N
	}
	return out
}
