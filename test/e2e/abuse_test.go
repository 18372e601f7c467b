package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestCPUAbuse runs the CPU-abuse rule (docs/abuse.md) with a window of
// seconds, on each runtime: a spinning ephemeral sandbox is warned, then
// stopped with end_reason cpu_abuse; an idle one beside it goes on; a
// spinning long-running one is warned, then throttled to half its CPU (its
// host cgroup's quota halved) and goes on. The threshold is half of a
// half-core quota (a quarter of a core), so that a busy 2-core host still
// gives a spinner enough of it.
func TestCPUAbuse(t *testing.T) {
	const (
		cpu    = 0.5
		window = 3 * time.Second
	)
	s := startServerT(t, serverOptions{args: []string{"--cpu-abuse-threshold", "0.5",
		"--cpu-abuse-window", window.String(), "--cpu-abuse-interval", "500ms"}})
	c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			ctx := ctxT(t, 3*time.Minute)
			spinner := mustCreateOn(t, s, c, client.CreateSandboxRequest{Runtime: rt, CPU: cpu})
			idle := mustCreateOn(t, s, c, client.CreateSandboxRequest{Runtime: rt, CPU: cpu})
			long := mustCreateOn(t, s, c, client.CreateSandboxRequest{Runtime: rt, CPU: cpu, LongRunning: true})
			if !long.LongRunning || spinner.LongRunning {
				t.Fatalf("long_running: %v and %v", long.LongRunning, spinner.LongRunning)
			}
			if q := hostCPUQuota(t, long.ID); q != cpu {
				t.Fatalf("the long-running sandbox's host quota is %v cores before any throttle, want %v", q, cpu)
			}
			for _, sb := range []*client.Sandbox{spinner, long} {
				// A daemon: the exec returns, the loop runs on.
				mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "(while :; do :; done) >/dev/null 2>&1 &"})
			}

			// The ephemeral spinner ends with cpu_abuse, warned first.
			deadline := time.Now().Add(60 * time.Second)
			var got *client.Sandbox
			for {
				var err error
				if got, err = c.GetSandbox(ctx, spinner.ID); err != nil {
					t.Fatal(err)
				}
				if got.State != client.StateRunning || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if got.State != client.StateDeleted || got.EndReason != client.EndReasonCPUAbuse {
				t.Fatalf("the spinner: state %s, end reason %q, want deleted, %q\n%s", got.State, got.EndReason, client.EndReasonCPUAbuse, tail(s.logPath, 40))
			}
			if got.CPUAbuseWarnedAt == nil || got.EndedAt == nil || got.CPUAbuseWarnedAt.After(*got.EndedAt) {
				t.Errorf("the spinner was not warned before its end: warned %v, ended %v", got.CPUAbuseWarnedAt, got.EndedAt)
			}
			if _, err := c.Exec(ctx, spinner.ID, client.ExecRequest{Cmd: "true"}); client.ErrorCode(err) != client.CodeSandboxNotRunning {
				t.Errorf("exec in the stopped spinner: %v", err)
			}

			// The long-running spinner is throttled, not stopped.
			deadline = time.Now().Add(60 * time.Second)
			for {
				var err error
				if got, err = c.GetSandbox(ctx, long.ID); err != nil {
					t.Fatal(err)
				}
				if got.CPUThrottledAt != nil || got.State != client.StateRunning || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if got.State != client.StateRunning || got.CPUThrottledAt == nil || got.CPUAbuseWarnedAt == nil {
				t.Fatalf("the long-running spinner: %+v\n%s", got, tail(s.logPath, 40))
			}
			if q := hostCPUQuota(t, long.ID); q != cpu/2 {
				t.Errorf("the throttled sandbox's host quota is %v cores, want %v", q, cpu/2)
			}
			// Two windows later both are still there, the throttle kept.
			time.Sleep(2 * window)
			for _, sb := range []*client.Sandbox{idle, long} {
				got, err := c.GetSandbox(ctx, sb.ID)
				if err != nil || got.State != client.StateRunning {
					t.Errorf("%s (long_running %v): %+v, %v", sb.ID, sb.LongRunning, got, err)
				}
				if sb == idle && got != nil && (got.CPUAbuseWarnedAt != nil || got.CPUThrottledAt != nil) {
					t.Errorf("the idle sandbox was warned or throttled: %+v", got)
				}
			}
			if r := mustExec(t, c, long.ID, client.ExecRequest{Cmd: "echo alive"}); strings.TrimSpace(r.Stdout) != "alive" {
				t.Errorf("exec in the throttled sandbox: %+v", r)
			}
			if q := hostCPUQuota(t, long.ID); q != cpu/2 {
				t.Errorf("the throttle did not last: quota %v cores", q)
			}
			// The warnings are in the server's log, at WARN.
			log, _ := os.ReadFile(s.logPath)
			for _, id := range []string{spinner.ID, long.ID} {
				if !logHas(string(log), "cpu abuse warning", id) {
					t.Errorf("no WARN line of the warning of %s in the server's log", id)
				}
			}
			for line := range strings.SplitSeq(string(log), "\n") {
				if strings.Contains(line, "cpu abuse") && (strings.Contains(line, spinner.ID) || strings.Contains(line, long.ID)) {
					t.Log(line)
				}
			}
			if logHas(string(log), "cpu abuse", idle.ID) {
				t.Errorf("the idle sandbox %s is in a cpu abuse log line", idle.ID)
			}
		})
	}
}

// TestCPUAbuseTariff: a tariff's own CPU-abuse rule is over the server's:
// a spinner of a tariff whose window is 0 is exempt; a bad threshold is
// refused.
func TestCPUAbuseTariff(t *testing.T) {
	s := startServerT(t, serverOptions{args: []string{"--cpu-abuse-threshold", "0.5",
		"--cpu-abuse-window", "3s", "--cpu-abuse-interval", "500ms"}})
	c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	ctx := ctxT(t, 3*time.Minute)
	none := 0.0
	if _, err := s.admin.PutTariff(ctx, "exempt", client.PutTariffRequest{CPU: 1, MemoryMB: 512, DiskMB: 1024,
		PriceVCPUSecond: "0", PriceGiBSecond: "0", PriceDiskGiBSecond: "0", CPUAbuseWindowSeconds: &none}); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetTariff(ctx, "exempt")
	if err != nil || got.CPUAbuseWindowSeconds == nil || *got.CPUAbuseWindowSeconds != 0 || got.CPUAbuseThreshold != nil {
		t.Fatalf("the exempt tariff: %+v, %v", got, err)
	}
	bad := 1.5
	if _, err := s.admin.PutTariff(ctx, "bad", client.PutTariffRequest{CPU: 1, MemoryMB: 512, DiskMB: 1024,
		PriceVCPUSecond: "0", PriceGiBSecond: "0", PriceDiskGiBSecond: "0", CPUAbuseThreshold: &bad}); client.ErrorCode(err) != client.CodeBadRequest {
		t.Errorf("a threshold of 1.5: %v", err)
	}
	spinner := mustCreateOn(t, s, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces, Tariff: "exempt", CPU: 0.5})
	mustExec(t, c, spinner.ID, client.ExecRequest{Cmd: "(while :; do :; done) >/dev/null 2>&1 &"})
	time.Sleep(3 * 3 * time.Second) // three of the server's windows
	if sb, err := c.GetSandbox(ctx, spinner.ID); err != nil || sb.State != client.StateRunning || sb.CPUAbuseWarnedAt != nil {
		t.Errorf("a spinner of an exempt tariff: %+v, %v", sb, err)
	}
}

// logHas reports whether a WARN line of log has both what and id.
func logHas(log, what, id string) bool {
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, what) && strings.Contains(line, id) && strings.Contains(line, "WARN") {
			return true
		}
	}
	return false
}

// hostCPUQuota reads the CPU quota, in cores, of sandbox id's host cgroup
// (cgroup v1: cpu.cfs_quota_us over cpu.cfs_period_us; v2: cpu.max): the
// limit the kernel enforces, whatever the server reports.
func hostCPUQuota(t *testing.T, id string) float64 {
	t.Helper()
	if m, _ := filepath.Glob("/sys/fs/cgroup/cpu/*/" + id + "/cpu.cfs_quota_us"); len(m) == 1 {
		quota, period := readNumber(t, m[0]), readNumber(t, filepath.Join(filepath.Dir(m[0]), "cpu.cfs_period_us"))
		return quota / period
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/" + id + "/cpu.max"); len(m) == 1 {
		b, err := os.ReadFile(m[0])
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		q, err1 := strconv.ParseFloat(f[0], 64)
		p, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %q", m[0], b)
		}
		return q / p
	}
	t.Fatalf("no host cgroup with a CPU quota for sandbox %s", id)
	return 0
}

func readNumber(t *testing.T, path string) float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}
