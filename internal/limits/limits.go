// Package limits is the one table of the limits evalbox's server enforces:
// each one's name, default, unit, `evalbox serve` flag, what it bounds and
// where it is enforced (with the answer past it). The serve flags take
// their defaults from the constants below, the server builds the team
// defaults from them, the enforcing packages use them, and docs/limits.md
// is Markdown()'s output (`evalbox limits --markdown`; TestDocs fails when
// it differs), so the published quota table cannot drift from the code.
//
// It is a leaf: the CLI, the server and the services import it, never the
// reverse.
//
// To add a limit: a constant here, its row in table (with its flag, if it
// has one, which internal/cli's TestServeFlagsMatchLimits checks), its use
// where it is enforced, then `go test ./internal/limits -run TestDocs
// -update`.
package limits

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Team limits: the defaults of a team's client.Limits (PATCH
// /v1/teams/{id} sets a team's own).
const (
	MaxSandboxes       = 20
	MaxConcurrentExecs = 64
	MaxStorageMB       = 20 << 10
	// RequestsPerMinute and CreatesPerMinute are the default request
	// rates of a team (its token buckets, per API replica); a team whose
	// own is 0 has these. Burst gives a bucket's size.
	RequestsPerMinute = 60000
	CreatesPerMinute  = 6000
	// KeyRequestsPerMinute is the request rate of one API key (0: none
	// apart from its team's).
	KeyRequestsPerMinute = 0
)

// Burst is the size of a token bucket of perMinute requests a minute: ten
// seconds' worth, at least 1. A client idle that long may send that many
// at once; after it, requests pass at the bucket's rate.
func Burst(perMinute int) int { return max(1, perMinute/6) }

// Server and sandbox limits.
const (
	DefaultTimeout = 5 * time.Minute
	MaxTimeout     = 24 * time.Hour
	MaxFileBytes   = 1 << 30
	MaxBuilds      = 2
	BuildTimeout   = 30 * time.Minute
	ExecWait       = 10 * time.Minute
	OutputMemoryMB = 1024
	Pids           = 1024
	// MemoryOvercommit is how many times the host's memory the sandboxes'
	// memory limits may add up to.
	MemoryOvercommit   = 2
	HTTPReadHeader     = 10 * time.Second
	HTTPIdle           = 2 * time.Minute
	HTTPMaxHeaderBytes = 64 << 10

	MaxCPU         = 8
	MaxMemoryMB    = 8192
	MaxDiskMB      = 10240
	MaxCreateWait  = 10 * time.Minute
	MaxOutputBytes = 16 << 20
	MaxOutputLimit = 128 << 20
	MaxJSONBody    = 4 << 20
	MaxEvalBody    = 256 << 20
	MaxWatches     = 16

	ExecuteDefaultTimeout = 10 * time.Second
	ExecuteMaxTimeout     = 10 * time.Minute
	ExecuteMaxScripts     = 4096
	EvalMaxSamples        = 200_000
	EvalDefaultTimeout    = 3 * time.Second
	EvalMaxTimeout        = 10 * time.Minute
	FusionMaxBody         = 32 << 20
	FusionMaxOutputBytes  = 8 << 20
	E2BMaxJSONBody        = 1 << 20

	// CPUAbuseThreshold and CPUAbuseWindow are the CPU-abuse rule's
	// (docs/abuse.md): a sandbox above the threshold of its CPU quota for
	// longer than the window is stopped, or throttled if long-running.
	CPUAbuseThreshold = 0.9
	CPUAbuseWindow    = 15 * time.Minute
	// CPUAbuseInterval is how often the rule samples (not a limit: no row).
	CPUAbuseInterval = 10 * time.Second

	// MaxSecrets and MaxSecretBytes bound a sandbox's secrets (given and
	// referenced together) and each value (docs/secrets.md).
	MaxSecrets     = 64
	MaxSecretBytes = 32 << 10

	// BillingMinimum and BillingGranularity are how a sandbox's metered
	// time is billed; MeterInterval how often usage is saved (docs/usage.md).
	BillingMinimum     = 60 * time.Second
	BillingGranularity = time.Second
	MeterInterval      = 5 * time.Second
)

// Unit is how a limit's value is counted.
type Unit string

// Units.
const (
	Count     Unit = "count"
	PerMinute Unit = "per minute"
	MiB       Unit = "MiB"
	Bytes     Unit = "bytes"
	Duration  Unit = "duration"
	Ratio     Unit = "ratio"
)

// Limit is one row of the table.
type Limit struct {
	// Name is the limit's name: a team's Limits field, else a name of its
	// own.
	Name string
	// Scope is what it is counted for: team, key, sandbox, request or
	// server.
	Scope string
	// Default is the value (int for counts and sizes, time.Duration for
	// durations, float64 for ratios); 0 may mean none, as Bounds says.
	Default any
	Unit    Unit
	// Flag is the `evalbox serve` flag that sets it ("" = none; a team
	// limit is also set per team by PATCH /v1/teams/{id}).
	Flag string
	// Bounds says what it bounds; Enforced where, and the answer past it.
	Bounds   string
	Enforced string
}

// table lists every limit, team limits first.
var table = []Limit{
	{"max_sandboxes", "team", MaxSandboxes, Count, "max-sandboxes",
		"running sandboxes of a team", "create: 429 `too_many_sandboxes`"},
	{"max_concurrent_execs", "team", MaxConcurrentExecs, Count, "max-execs",
		"commands of a team running at once (exec, background processes, execute, run_code, eval trials)", "queued up to `exec-wait`, then 429 `rate_limited`"},
	{"max_storage_mb", "team", MaxStorageMB, MiB, "max-storage-mb",
		"what a team stores: templates, uploads being processed, eval inputs, snapshots (0 = none)", "413 `storage_quota_exceeded`"},
	{"requests_per_minute", "team", RequestsPerMinute, PerMinute, "rate-limit-requests-per-minute",
		"authenticated API requests of a team, all its keys together, per API replica (bucket: 10 s' worth); admin keys are exempt", "auth: 429 `rate_limited` with `Retry-After`"},
	{"creates_per_minute", "team", CreatesPerMinute, PerMinute, "rate-limit-creates-per-minute",
		"creates of a team (`POST /v1/sandboxes`, fork, resume, `POST /v1/evals`; E2B's create, fork, resume), per API replica, apart from `max_sandboxes` (bucket: 10 s' worth)", "auth: 429 `rate_limited` with `Retry-After`"},
	{"key_requests_per_minute", "key", KeyRequestsPerMinute, PerMinute, "rate-limit-key-requests-per-minute",
		"API requests of one key, within its team's (0 = only the team's), per API replica", "auth: 429 `rate_limited` with `Retry-After`"},
	{"max_builds", "team", MaxBuilds, Count, "max-builds",
		"template builds of a team running at once", "more queue"},
	{"default_timeout", "sandbox", DefaultTimeout, Duration, "default-timeout",
		"a sandbox's TTL when its create gives none", "the sandbox ends (`expired`)"},
	{"max_timeout", "sandbox", MaxTimeout, Duration, "max-timeout",
		"a sandbox's TTL (create, set timeout), and a command's timeout", "400 `bad_request`"},
	{"max_cpu", "sandbox", MaxCPU, Count, "",
		"a sandbox's vCPUs", "create: 400 `bad_request`"},
	{"max_memory_mb", "sandbox", MaxMemoryMB, MiB, "",
		"a sandbox's memory", "create: 400 `bad_request`"},
	{"max_disk_mb", "sandbox", MaxDiskMB, MiB, "",
		"a sandbox's disk", "create: 400 `bad_request`; a full disk: 507 `no_space`"},
	{"pids", "sandbox", Pids, Count, "pids",
		"tasks (processes and threads) of a sandbox, reserved from the host's pids", "fork fails in the sandbox (EAGAIN)"},
	{"max_create_wait", "request", MaxCreateWait, Duration, "",
		"a create's `wait_seconds` (queueing for room)", "400 `bad_request`"},
	{"exec_wait", "request", ExecWait, Duration, "exec-wait",
		"how long a command queues for its team's exec slot (0 = not at all)", "429 `rate_limited`"},
	{"max_output_bytes", "request", MaxOutputBytes, Bytes, "",
		"the stdout and stderr, each, that a command keeps when it gives no `max_output_bytes`", "output truncated (`stdout_truncated`, `stderr_truncated`)"},
	{"max_output_limit", "request", MaxOutputLimit, Bytes, "",
		"the largest `max_output_bytes` a command may ask for", "400 `bad_request`"},
	{"max_watches", "sandbox", MaxWatches, Count, "",
		"directory watches open on a sandbox", "429 `rate_limited`"},
	{"execute_default_timeout", "request", ExecuteDefaultTimeout, Duration, "",
		"a `POST /v1/execute` or SandboxFusion `run_code` script's run when it gives no timeout", "the run is `timed_out` (SandboxFusion: `TimeLimitExceeded`)"},
	{"execute_max_timeout", "request", ExecuteMaxTimeout, Duration, "",
		"the timeout a `POST /v1/execute` or SandboxFusion `run_code` request may give", "400 `bad_request` (SandboxFusion: 422)"},
	{"execute_max_scripts", "request", ExecuteMaxScripts, Count, "",
		"the scripts of one `POST /v1/execute`", "400 `bad_request`"},
	{"eval_max_samples", "request", EvalMaxSamples, Count, "",
		"the samples of one eval run", "413 `payload_too_large`"},
	{"eval_default_timeout", "request", EvalDefaultTimeout, Duration, "",
		"an eval trial's run when the run gives no timeout", "the trial is `timed_out`"},
	{"eval_max_timeout", "request", EvalMaxTimeout, Duration, "",
		"the trial timeout an eval run may give", "400 `bad_request`"},
	{"max_file_bytes", "request", MaxFileBytes, Bytes, "max-file-bytes",
		"a file upload", "413 `payload_too_large`"},
	{"max_json_body", "request", MaxJSONBody, Bytes, "",
		"a JSON request body of `/v1` (but eval runs')", "413 `payload_too_large`"},
	{"max_eval_body", "request", MaxEvalBody, Bytes, "",
		"the body of `POST /v1/evals`", "413 `payload_too_large`"},
	{"fusion_max_body", "request", FusionMaxBody, Bytes, "",
		"a SandboxFusion request body", "413"},
	{"fusion_max_output_bytes", "request", FusionMaxOutputBytes, Bytes, "",
		"the stdout and stderr, each, of a SandboxFusion run", "output truncated"},
	{"e2b_max_json_body", "request", E2BMaxJSONBody, Bytes, "",
		"a JSON request body of E2B's API", "413"},
	{"http_max_header_bytes", "request", HTTPMaxHeaderBytes, Bytes, "",
		"a request's headers", "431"},
	{"http_read_header_timeout", "request", HTTPReadHeader, Duration, "http-read-header-timeout",
		"the time a client has to send a request's headers (hidden flag)", "the connection is closed"},
	{"http_idle_timeout", "server", HTTPIdle, Duration, "http-idle-timeout",
		"a keep-alive connection's idle time (hidden flag)", "the connection is closed"},
	{"output_memory_mb", "server", OutputMemoryMB, MiB, "output-memory-mb",
		"command output held in memory for buffered answers and eval runs, all teams together", "429 `output_budget_exhausted`"},
	{"memory_overcommit", "server", float64(MemoryOvercommit), Ratio, "memory-overcommit",
		"the sandboxes' memory limits together, in times the host's memory", "create: 503 `insufficient_capacity`"},
	{"build_timeout", "request", BuildTimeout, Duration, "build-timeout",
		"one template build", "the build fails"},
	{"max_secrets", "sandbox", MaxSecrets, Count, "",
		"a sandbox's secrets, `secrets` and `secret_refs` together (docs/secrets.md)", "create: 400 `bad_request`"},
	{"max_secret_bytes", "request", MaxSecretBytes, Bytes, "",
		"a secret's value (given at create or stored with `PUT /v1/secrets/{name}`)", "400 `bad_request`"},
	{"billing_minimum", "sandbox", BillingMinimum, Duration, "billing-minimum",
		"what a sandbox's running time is billed at least (0 = none; docs/usage.md)", "`GET /v1/usage` bills the minimum"},
	{"billing_granularity", "sandbox", BillingGranularity, Duration, "billing-granularity",
		"the unit a sandbox's metered time is rounded up to", "`GET /v1/usage` rounds up"},
	{"meter_interval", "server", MeterInterval, Duration, "meter-interval",
		"how often metered usage is saved: what a crash of every server may lose of it, at most", "usage between the last save and a crash is not billed"},
	{"cpu_abuse_threshold", "sandbox", CPUAbuseThreshold, Ratio, "cpu-abuse-threshold",
		"the share of its CPU quota above which a sandbox's time counts toward `cpu_abuse_window` (docs/abuse.md)", "see `cpu_abuse_window`"},
	{"cpu_abuse_window", "sandbox", CPUAbuseWindow, Duration, "cpu-abuse-window",
		"how long a sandbox may stay above `cpu_abuse_threshold` (0 = no CPU-abuse rule); warned at 80 % of it (`cpu_abuse_warned_at`)",
		"an ephemeral sandbox is stopped (`deleted`, end reason `cpu_abuse`); a `long_running` one is throttled to half its CPU (`cpu_throttled_at`)"},
}

// All returns the table.
func All() []Limit { return append([]Limit(nil), table...) }

// Lookup returns the limit of this name.
func Lookup(name string) (Limit, bool) {
	for _, l := range table {
		if l.Name == name {
			return l, true
		}
	}
	return Limit{}, false
}

// Value is l's default as it is written: 20, 1 GiB, 5m0s, none.
func (l Limit) Value() string {
	switch v := l.Default.(type) {
	case time.Duration:
		return v.String()
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case int:
		if v == 0 {
			return "0 (none)"
		}
		switch l.Unit {
		case Bytes:
			return sizeString(int64(v))
		case MiB:
			return sizeString(int64(v) << 20)
		case PerMinute:
			return fmt.Sprintf("%d/min", v)
		}
		return strconv.Itoa(v)
	}
	return fmt.Sprint(l.Default)
}

// sizeString writes n bytes in the largest binary unit that divides it.
func sizeString(n int64) string {
	for _, u := range []struct {
		name  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// Markdown is the table as docs/limits.md shows it.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| limit | scope | default | `evalbox serve` flag | bounds | enforced |\n|---|---|---|---|---|---|\n")
	for _, l := range table {
		flag := "—"
		if l.Flag != "" {
			flag = "`--" + l.Flag + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", l.Name, l.Scope, l.Value(), flag, l.Bounds, l.Enforced)
	}
	return b.String()
}
