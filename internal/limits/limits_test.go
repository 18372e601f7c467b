package limits_test

import (
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/evalrun"
	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/sandbox"
)

// update rewrites docs/limits.md's table from the code (go test
// ./internal/limits -run TestDocs -update).
var update = flag.Bool("update", false, "rewrite docs/limits.md's table from Markdown()")

// Markers around the generated table in docs/limits.md.
const (
	docsPath  = "../../docs/limits.md"
	docsBegin = "<!-- BEGIN limits.Markdown(): generated, go test ./internal/limits -run TestDocs -update -->\n"
	docsEnd   = "<!-- END limits.Markdown() -->\n"
)

// TestDocs: docs/limits.md's table is Markdown()'s, between its markers.
func TestDocs(t *testing.T) {
	b, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	before, rest, ok := strings.Cut(doc, docsBegin)
	table, after, ok2 := strings.Cut(rest, docsEnd)
	if !ok || !ok2 {
		t.Fatalf("%s: no %q … %q markers", docsPath, docsBegin, docsEnd)
	}
	if table == limits.Markdown() {
		return
	}
	if *update {
		if err := os.WriteFile(docsPath, []byte(before+docsBegin+limits.Markdown()+docsEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's table is not limits.Markdown()'s: run go test ./internal/limits -run TestDocs -update\n--- docs\n%s--- Markdown()\n%s", docsPath, table, limits.Markdown())
}

func TestTable(t *testing.T) {
	seen := map[string]bool{}
	flags := map[string]bool{}
	for _, l := range limits.All() {
		if l.Name == "" || seen[l.Name] {
			t.Errorf("name %q empty or twice", l.Name)
		}
		seen[l.Name] = true
		if l.Flag != "" && flags[l.Flag] {
			t.Errorf("flag --%s twice", l.Flag)
		}
		flags[l.Flag] = true
		if l.Bounds == "" || l.Enforced == "" || l.Scope == "" {
			t.Errorf("%s: bounds, enforced or scope missing", l.Name)
		}
		switch l.Default.(type) {
		case int, float64, time.Duration:
		default:
			t.Errorf("%s: default of type %T", l.Name, l.Default)
		}
		if strings.Contains(l.Bounds+l.Enforced, "|") {
			t.Errorf("%s: a | would break the Markdown table", l.Name)
		}
		if got, ok := limits.Lookup(l.Name); !ok || got.Name != l.Name {
			t.Errorf("Lookup(%s) = %v, %v", l.Name, got, ok)
		}
	}
	for _, c := range []struct {
		perMinute, burst int
	}{{60, 10}, {1, 1}, {5, 1}, {6, 1}, {12, 2}, {30000, 5000}} {
		if b := limits.Burst(c.perMinute); b != c.burst {
			t.Errorf("Burst(%d) = %d, want %d", c.perMinute, b, c.burst)
		}
	}
	if v := must(t, "max_storage_mb").Value(); v != "20 GiB" {
		t.Errorf("max_storage_mb shows %q", v)
	}
	if v := must(t, "key_requests_per_minute").Value(); v != "0 (none)" {
		t.Errorf("key_requests_per_minute shows %q", v)
	}
}

func must(t *testing.T, name string) limits.Limit {
	t.Helper()
	l, ok := limits.Lookup(name)
	if !ok {
		t.Fatalf("no limit %s", name)
	}
	return l
}

// TestEnforcedValues holds the table equal to the exported constants of
// the packages that enforce its limits (the unexported ones are held by
// those packages' own tests: limits_test.go in each).
func TestEnforcedValues(t *testing.T) {
	seconds := func(d time.Duration) float64 { return d.Seconds() }
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"max_watches", sandbox.MaxWatches, limits.MaxWatches},
		{"pids", sandbox.DefaultPids, limits.Pids},
		{"max_secrets", sandbox.MaxSecrets, limits.MaxSecrets},
		{"max_secret_bytes", sandbox.MaxSecretBytes, limits.MaxSecretBytes},
		{"billing_minimum", meter.DefaultMinimum, limits.BillingMinimum},
		{"billing_granularity", meter.DefaultGranularity, limits.BillingGranularity},
		{"meter_interval", meter.DefaultInterval, limits.MeterInterval},
		{"memory_overcommit", float64(node.DefaultMemoryOvercommit), float64(limits.MemoryOvercommit)},
		{"eval_max_samples", evalrun.MaxSamples, limits.EvalMaxSamples},
		{"eval_default_timeout", evalrun.DefaultTimeout, seconds(limits.EvalDefaultTimeout)},
		{"eval_max_timeout", evalrun.MaxTimeout, seconds(limits.EvalMaxTimeout)},
	} {
		if c.got != c.want {
			t.Errorf("%s: the code's %v, the table's %v", c.name, c.got, c.want)
		}
	}
}
