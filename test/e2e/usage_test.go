package e2e

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/pkg/client"
)

// lifetime is a sandbox's life as the client saw it: its row's start is
// after created began and before it returned, its end after delete began
// and before it returned.
type lifetime struct{ createBegan, created, deleteBegan, deleted time.Time }

func (l lifetime) atMost() float64  { return l.deleted.Sub(l.createBegan).Seconds() }
func (l lifetime) atLeast() float64 { return l.deleteBegan.Sub(l.created).Seconds() }

func usageBy(t *testing.T, c *client.Client, o client.UsageOptions) map[string]client.UsageLine {
	t.Helper()
	r, err := c.Usage(ctxT(t, time.Minute), o)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]client.UsageLine{}
	for _, l := range r.Groups {
		out[l.Key] = l
	}
	return out
}

// usageLine is the line of key in r (zero if none).
func usageLine(r client.UsageReport, key string) client.UsageLine {
	for _, l := range r.Groups {
		if l.Key == key {
			return l
		}
	}
	return client.UsageLine{}
}

// expectedCost is what billed seconds of a sandbox cost at the built-in
// tariffs' prices (all three have the same): per vCPU, GiB and disk GiB.
func expectedCost(sb *client.Sandbox, billed, paused float64) string {
	perSecond := func(cpu float64, mem, disk int) float64 {
		return cpu*14000 + float64(mem)/1024*4500 + float64(disk)/1024*40
	}
	n := billed*perSecond(sb.CPU, sb.MemoryMB, sb.DiskMB) + paused*float64(sb.DiskMB)/1024*40
	return meter.FormatMoney(int64(math.Floor(n + 1e-6)))
}

// TestUsageMetering: three sandboxes of known lifetimes give their
// seconds (the minimum applied to the short one), priced at their
// tariff; a paused stretch is metered apart and priced for disk only;
// tariffs shape sandboxes and refuse what is above them; usage is the
// team's own; admins manage tariffs.
func TestUsageMetering(t *testing.T) {
	s := startServerT(t, serverOptions{args: []string{"--meter-interval", "200ms", "--billing-minimum", "2s"}})
	c, _, key := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	other, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2})
	ctx := ctxT(t, 5*time.Minute)
	start := time.Now().Add(-time.Second)

	// Three sandboxes living about 0.5, 2.5 and 4 s, at once.
	wants := []time.Duration{500 * time.Millisecond, 2500 * time.Millisecond, 4 * time.Second}
	sbs := make([]*client.Sandbox, len(wants))
	lives := make([]lifetime, len(wants))
	done := make(chan int)
	for i, d := range wants {
		go func() {
			defer func() { done <- i }()
			lives[i].createBegan = time.Now()
			sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
			lives[i].created = time.Now()
			if err != nil {
				t.Error(err)
				return
			}
			sbs[i] = sb
			time.Sleep(d)
			lives[i].deleteBegan = time.Now()
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Error(err)
			}
			lives[i].deleted = time.Now()
		}()
	}
	for range wants {
		<-done
	}
	if t.Failed() {
		t.FailNow()
	}
	by := usageBy(t, c, client.UsageOptions{GroupBy: "sandbox", From: start})
	for i, sb := range sbs {
		l, ok := by[sb.ID]
		if !ok {
			t.Fatalf("no usage of %s: %+v", sb.ID, by)
		}
		if sb.Tariff != "standard" {
			t.Errorf("a sandbox created without a tariff has %q, want the default standard", sb.Tariff)
		}
		if l.RunningSeconds < lives[i].atLeast()-0.01 || l.RunningSeconds > lives[i].atMost()+0.01 {
			t.Errorf("sandbox %d ran %.3fs, want between %.3f and %.3f", i, l.RunningSeconds, lives[i].atLeast(), lives[i].atMost())
		}
		billed := math.Max(2, math.Ceil(l.RunningSeconds))
		if l.BilledSeconds != billed || l.PausedSeconds != 0 {
			t.Errorf("sandbox %d billed %vs (paused %v), want %vs", i, l.BilledSeconds, l.PausedSeconds, billed)
		}
		if want := expectedCost(sb, billed, 0); l.Cost != want {
			t.Errorf("sandbox %d cost %s, want %s", i, l.Cost, want)
		}
	}
	if sum := usageBy(t, c, client.UsageOptions{From: start})["standard"]; sum.Sandboxes != 3 {
		t.Errorf("by tariff: %+v", sum)
	}
	// Charged at the meter's next tick, and counted in /metrics.
	var metrics []byte
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if metrics, err = s.admin.Metrics(ctx); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(metrics), `evalbox_usage_charged_sandboxes_total{tariff="standard"} 3`) {
			break
		}
	}
	if !strings.Contains(string(metrics), `evalbox_usage_charged_sandboxes_total{tariff="standard"} 3`) ||
		!strings.Contains(string(metrics), `evalbox_usage_cost_total{tariff="standard"}`) {
		t.Errorf("no usage counters of the three sandboxes in /metrics")
	}

	// Tariffs: the shape, what may be lowered, what may not.
	small, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, Tariff: "small"})
	if err != nil {
		t.Fatal(err)
	}
	if small.CPU != 1 || small.MemoryMB != 512 || small.DiskMB != 2048 || small.Tariff != "small" {
		t.Errorf("a small sandbox: %+v", small)
	}
	lower, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, Tariff: "small", MemoryMB: 256})
	if err != nil || lower.MemoryMB != 256 || lower.CPU != 1 {
		t.Fatalf("small with less memory: %+v, %v", lower, err)
	}
	for name, req := range map[string]client.CreateSandboxRequest{
		"above the tariff": {Template: "base", Tariff: "small", CPU: 2},
		"unknown tariff":   {Template: "base", Tariff: "no-such"},
	} {
		if _, err := c.CreateSandbox(ctx, req); client.ErrorCode(err) != client.CodeBadRequest {
			t.Errorf("%s: %v, want bad_request", name, err)
		}
	}
	// A paused stretch (gVisor) is metered apart: disk only.
	g, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeGVisor, Tariff: "small"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	time.Sleep(1500 * time.Millisecond)
	if _, err := c.Resume(ctx, g.ID, client.ResumeRequest{}); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	for _, sb := range []*client.Sandbox{small, lower, g} {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	by = usageBy(t, c, client.UsageOptions{GroupBy: "sandbox", From: start})
	gl := by[g.ID]
	if gl.PausedSeconds < 1.4 || gl.PausedSeconds > resumed.Sub(pausedAt).Seconds()+5 || gl.RunningSeconds <= 0 {
		t.Errorf("the paused sandbox: %+v (paused for %v as the client saw it)", gl, resumed.Sub(pausedAt))
	}
	if want := expectedCost(g, gl.BilledSeconds, gl.BilledPausedSeconds); gl.Cost != want {
		t.Errorf("the paused sandbox costs %s, want %s (%+v)", gl.Cost, want, gl)
	}
	tariffs := usageBy(t, c, client.UsageOptions{From: start})
	if tariffs["small"].Sandboxes != 3 || tariffs["standard"].Sandboxes != 3 {
		t.Errorf("by tariff: %+v", tariffs)
	}
	days := usageBy(t, c, client.UsageOptions{From: start, GroupBy: "day"})
	if len(days) < 1 || len(days) > 2 {
		t.Errorf("by day: %+v", days)
	}

	// Usage is the team's: another team sees none of it, nor all of it.
	if o := usageBy(t, other, client.UsageOptions{From: start, GroupBy: "sandbox"}); len(o) != 0 {
		t.Errorf("another team sees %+v", o)
	}
	if _, err := other.Usage(ctx, client.UsageOptions{Team: "all"}); client.ErrorCode(err) != client.CodeForbidden {
		t.Errorf("a team asking for all usage: %v, want forbidden", err)
	}
	if all := usageBy(t, s.admin, client.UsageOptions{From: start, GroupBy: "sandbox", Team: "all"}); len(all) != 6 {
		t.Errorf("the admin's view of every team: %d sandboxes, want 6", len(all))
	}
	for q, bad := range map[string]client.UsageOptions{
		"group_by": {GroupBy: "week"},
		"window":   {From: time.Now(), To: time.Now().Add(-time.Hour)},
	} {
		if _, err := c.Usage(ctx, bad); client.ErrorCode(err) != client.CodeBadRequest {
			t.Errorf("bad %s: %v", q, err)
		}
	}

	// Tariffs are the admins': a team may read, not write.
	if _, err := c.PutTariff(ctx, "cheap", client.PutTariffRequest{CPU: 1, MemoryMB: 256, DiskMB: 512, PriceVCPUSecond: "0", PriceGiBSecond: "0", PriceDiskGiBSecond: "0"}); client.ErrorCode(err) != client.CodeForbidden {
		t.Errorf("a team's put: %v, want forbidden", err)
	}
	out, errOut, code := runCLIOn(t, s, ctx, s.adminKey, "", "tariffs", "set", "cheap", "--cpu", "1", "--memory-mb", "256", "--disk-mb", "512",
		"--price-vcpu-second", "0.000001", "--price-gib-second", "0", "--price-disk-gib-second", "0")
	if code != 0 {
		t.Fatalf("tariffs set: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := runCLIOn(t, s, ctx, s.adminKey, "", "tariffs", "set", "bad", "--cpu", "1", "--memory-mb", "256", "--disk-mb", "512",
		"--price-vcpu-second", "-1"); code == 0 || !strings.Contains(errOut, "price_vcpu_second") {
		t.Errorf("a negative price: exit %d, %q", code, errOut)
	}
	cheap, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, Tariff: "cheap"})
	if err != nil {
		t.Fatal(err)
	}
	// A new price applies to sandboxes created after it.
	if _, err := s.admin.PutTariff(ctx, "cheap", client.PutTariffRequest{CPU: 1, MemoryMB: 256, DiskMB: 512, PriceVCPUSecond: "1", PriceGiBSecond: "0", PriceDiskGiBSecond: "0"}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, cheap.ID); err != nil {
		t.Fatal(err)
	}
	cl := usageBy(t, c, client.UsageOptions{From: start, GroupBy: "sandbox"})[cheap.ID]
	if want := meter.FormatMoney(int64(cl.BilledSeconds * 1000)); cl.Cost != want {
		t.Errorf("cheap cost %s, want %s at the price of its create", cl.Cost, want)
	}
	if err := s.admin.DeleteTariff(ctx, "cheap"); err != nil {
		t.Fatal(err)
	}
	// The default tariff prices every sandbox created without one: it stays.
	if err := s.admin.DeleteTariff(ctx, "standard"); client.ErrorCode(err) != client.CodeConflict {
		t.Errorf("deleting the default tariff: %v, want conflict", err)
	}
	high := client.PutTariffRequest{CPU: 1, MemoryMB: 256, DiskMB: 512, PriceVCPUSecond: "1001", PriceGiBSecond: "0", PriceDiskGiBSecond: "0"}
	if _, err := s.admin.PutTariff(ctx, "dear", high); client.ErrorCode(err) != client.CodeBadRequest {
		t.Errorf("a price above the maximum: %v, want bad_request", err)
	}
	out, _, code = runCLIOn(t, s, ctx, key, "", "usage", "--since", "1h", "--group-by", "tariff")
	if code != 0 || !strings.Contains(out, "cheap") || !strings.Contains(out, "TOTAL") {
		t.Errorf("evalbox usage: exit %d\n%s", code, out)
	}
	if _, errOut, code := runCLIOn(t, s, ctx, key, "", "usage", "--group-by", "week"); code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Errorf("evalbox usage --group-by week: exit %d, %q", code, errOut)
	}
}

// TestUsageAcrossCrash: a server killed with kill -9 and restarted neither
// loses more than a tick of its sandboxes' usage nor counts it twice.
func TestUsageAcrossCrash(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--meter-interval", "300ms", "--billing-minimum", "0"}
	s, err := startServer(serverOptions{dataDir: dir, args: args})
	if err != nil {
		t.Fatal(err)
	}
	c, _, key := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	ctx := ctxT(t, 5*time.Minute)
	start := time.Now()
	var ids []string
	var createdBy time.Time
	for range 2 {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		createdBy = time.Now()
	}
	time.Sleep(3 * time.Second)
	killedAt := time.Now()
	if err := s.crash(); err != nil {
		t.Fatal(err)
	}
	s2, err := startServer(serverOptions{dataDir: dir, args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.stop() })
	c2 := client.New(s2.url, key)
	read := func() map[string]client.UsageLine {
		return usageBy(t, c2, client.UsageOptions{From: start.Add(-time.Second), GroupBy: "sandbox"})
	}
	first := read()
	for _, id := range ids {
		l := first[id]
		lo, hi := killedAt.Sub(createdBy).Seconds()-0.3-0.5, killedAt.Sub(start).Seconds()
		if l.RunningSeconds < lo || l.RunningSeconds > hi {
			t.Errorf("%s across the crash: %.3fs metered, want between %.3f (a tick lost at most) and %.3f (its life)", id, l.RunningSeconds, lo, hi)
		}
		if sb, err := c2.GetSandbox(ctx, id); err != nil || sb.State != client.StateLost {
			t.Errorf("%s after the restart: %+v, %v", id, sb, err)
		}
	}
	// The restarted server's ticks add nothing to them.
	time.Sleep(time.Second)
	again := read()
	for _, id := range ids {
		if again[id].RunningSeconds != first[id].RunningSeconds {
			t.Errorf("%s counted again after the restart: %.3f then %.3f", id, first[id].RunningSeconds, again[id].RunningSeconds)
		}
	}
	// And it meters new sandboxes.
	sb, err := c2.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := c2.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if l := read()[sb.ID]; l.RunningSeconds < 1 || l.BilledSeconds != math.Ceil(l.RunningSeconds) {
		t.Errorf("a sandbox after the restart: %+v", l)
	}
}
