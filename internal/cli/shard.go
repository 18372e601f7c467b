package cli

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

// `evalbox shard`: a test suite split across sandboxes (CI workers).

// shardOpts are the flags of `evalbox shard`.
type shardOpts struct {
	template, runtime string
	shards            int
	dir               string
	patterns          []string
	junitOut          string
	durations         string
	junitArg          string
	timeout           seconds
	env               []string
}

// Where a shard's project and report go in its sandbox.
const (
	shardWorkdir = "/work"
	shardJUnit   = "/tmp/evalbox-shard-junit.xml"
	shardArchive = "/tmp/evalbox-shard-project.tar"
)

func newShardCmd(a *app) *cobra.Command {
	o := shardOpts{shards: 4, dir: ".", template: "python", junitOut: "junit.xml", durations: ".evalbox-shard-durations.json",
		junitArg: "--junitxml={}", timeout: seconds(30 * time.Minute), patterns: []string{"test_*.py", "*_test.py"}}
	cmd := &cobra.Command{
		Use:   "shard [flags] -- COMMAND [ARG...]",
		Short: "Split a test suite across sandboxes, run the parts in parallel and merge their JUnit reports",
		Long: `Upload the project (--dir) to --shards fresh sandboxes, split its test files
(--pattern, matched against file names) across them, run COMMAND in each with
its files and --junit-arg appended (pytest's --junitxml by default), stream
each shard's output prefixed with its number, and merge the shards' JUnit XML
into --junit-out. Files are split by the durations recorded by the last run
(--durations, written after each run), else evenly by count. The sandboxes are
deleted at the end, also on failure or Ctrl-C.

Exit status: 0 when every test passed; 1 when a test failed or errored, or a
shard's command ran past --timeout or exited non-zero with no failure in its
report (or without one).`,
		Example: `  evalbox shard --template my-project --shards 4 -- python3 -m pytest -q
  evalbox shard --pattern 'test_*.py' --junit-out report.xml -- python3 -m pytest -q -p no:cacheprovider`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if cmd.ArgsLenAtDash() != 0 {
				return usagef(cmd, "put the command after --: evalbox shard [flags] -- COMMAND")
			}
			if o.shards < 1 || o.shards > 256 {
				return usagef(cmd, "--shards %d: want 1 to 256", o.shards)
			}
			if !strings.Contains(o.junitArg, "{}") {
				return usagef(cmd, "--junit-arg %q: want {} where the report's path goes", o.junitArg)
			}
			env, err := parseKV(cmd, "env", o.env)
			if err != nil {
				return err
			}
			return runShard(cmd.Context(), cmd, a.client(), o, env, argv)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.template, "template", "t", o.template, "template of the sandboxes (with the test runner installed)")
	f.StringVar(&o.runtime, "runtime", "", "runtime: gvisor or namespaces (default: the server's)")
	f.IntVarP(&o.shards, "shards", "n", o.shards, "sandboxes to split the test files across")
	f.StringVar(&o.dir, "dir", o.dir, "the project to upload (its .git, virtualenvs, caches and node_modules are left out)")
	f.StringSliceVar(&o.patterns, "pattern", o.patterns, "test file name patterns (path.Match)")
	f.StringVar(&o.junitOut, "junit-out", o.junitOut, "where the merged JUnit XML report is written")
	f.StringVar(&o.durations, "durations", o.durations, "file of the recorded durations per test file (read, then rewritten)")
	f.StringVar(&o.junitArg, "junit-arg", o.junitArg, "argument that makes COMMAND write a JUnit report; {} is its path")
	f.Var(&o.timeout, "timeout", "time each shard's command may run")
	f.StringArrayVarP(&o.env, "env", "e", nil, "environment variable KEY=VALUE of the command (repeatable)")
	return cmd
}

// skipDir names the directories a project upload leaves out.
var skipDir = map[string]bool{".git": true, ".hg": true, "__pycache__": true, ".pytest_cache": true, ".mypy_cache": true,
	".ruff_cache": true, ".venv": true, "venv": true, "node_modules": true, ".tox": true}

// testFiles lists the project's test files, slash-separated and relative
// to dir, sorted.
func testFiles(dir string, patterns []string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir && skipDir[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		for _, pat := range patterns {
			if ok, _ := path.Match(pat, d.Name()); ok && d.Type().IsRegular() {
				rel, err := filepath.Rel(dir, p)
				if err != nil {
					return err
				}
				files = append(files, filepath.ToSlash(rel))
				break
			}
		}
		return nil
	})
	slices.Sort(files)
	return files, err
}

// splitFiles deals files to n shards: the longest first, each to the shard
// with the least time so far (durations in seconds, at least a millisecond
// each, so that every shard gets a file before any gets two; a file without
// one counts as the mean of those with one, or 1). There are never more
// shards than files, and none is empty: a shard without files would run the
// whole suite.
func splitFiles(files []string, n int, durations map[string]float64) [][]string {
	known, sum := 0, 0.0
	for _, f := range files {
		if d, ok := durations[f]; ok {
			known++
			sum += d
		}
	}
	def := 1.0
	if known > 0 {
		def = max(sum/float64(known), 1e-3)
	}
	cost := func(f string) float64 {
		if d, ok := durations[f]; ok {
			return max(d, 1e-3)
		}
		return def
	}
	order := slices.Clone(files)
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(cost(b), cost(a)) })
	shards := make([][]string, min(n, len(files)))
	load := make([]float64, len(shards))
	for _, f := range order {
		i := slices.Index(load, slices.Min(load))
		shards[i] = append(shards[i], f)
		load[i] += cost(f)
	}
	for _, s := range shards {
		slices.Sort(s)
	}
	return shards
}

// junitSuites is a JUnit report: <testsuites> or one <testsuite>.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	XMLName  xml.Name    `xml:"testsuite"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     float64     `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Classname string       `xml:"classname,attr"`
	Name      string       `xml:"name,attr"`
	File      string       `xml:"file,attr,omitempty"`
	Time      float64      `xml:"time,attr"`
	Failure   *junitResult `xml:"failure"`
	Error     *junitResult `xml:"error"`
	Skipped   *junitResult `xml:"skipped"`
	SystemOut string       `xml:"system-out,omitempty"`
	SystemErr string       `xml:"system-err,omitempty"`
}

type junitResult struct {
	Message string `xml:"message,attr,omitempty"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

// parseJUnit reads a report of either form.
func parseJUnit(b []byte) ([]junitSuite, error) {
	var many junitSuites
	if err := xml.Unmarshal(b, &many); err == nil {
		return many.Suites, nil
	}
	var one junitSuite
	if err := xml.Unmarshal(b, &one); err != nil {
		return nil, fmt.Errorf("not a JUnit XML report: %w", err)
	}
	return []junitSuite{one}, nil
}

// shardResult is what one shard did.
type shardResult struct {
	suites []junitSuite
	exit   *client.ExecResult
	err    error
}

func runShard(ctx context.Context, cmd *cobra.Command, c *client.Client, o shardOpts, env map[string]string, argv []string) error {
	files, err := testFiles(o.dir, o.patterns)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no test files in %s match %s", o.dir, strings.Join(o.patterns, ", "))
	}
	durations := map[string]float64{}
	if b, err := os.ReadFile(o.durations); err == nil {
		if err := json.Unmarshal(b, &durations); err != nil {
			return fmt.Errorf("%s: %w (delete it to split by count)", o.durations, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	parts := splitFiles(files, o.shards, durations)
	errw := cmd.ErrOrStderr()
	fmt.Fprintf(errw, "shard: %d test files across %d sandboxes of %s\n", len(files), len(parts), o.template)

	// Every sandbox of this run carries its id: a create cut off (by ctx,
	// or a lost answer) after the server made the sandbox leaves one whose
	// id never came back, and it is found by the tag and deleted at the end.
	runID := newRunID()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := c.DeleteSandboxes(dctx, map[string]string{"evalbox-shard-run": runID}); err != nil {
			fmt.Fprintf(errw, "shard: delete this run's sandboxes (evalbox-shard-run=%s): %v\n", runID, err)
		}
	}()

	start := time.Now()
	results := make([]shardResult, len(parts))
	var wg sync.WaitGroup
	var mu sync.Mutex // the prefixed output lines
	for i, part := range parts {
		wg.Go(func() {
			prefix := fmt.Sprintf("[shard %d] ", i+1)
			out, errOut := &prefixWriter{w: errw, mu: &mu, prefix: prefix}, &prefixWriter{w: errw, mu: &mu, prefix: prefix}
			results[i] = oneShard(ctx, c, o, env, argv, runID, i, part, out, errOut)
			out.Flush()
			errOut.Flush()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}

	merged := junitSuites{}
	var tests, failed, errored, skipped int
	var bad []string
	for i, r := range results {
		var sfail int
		for _, s := range r.suites {
			sfail += s.Failures + s.Errors
		}
		switch {
		case r.err != nil:
			bad = append(bad, fmt.Sprintf("shard %d: %v", i+1, r.err))
		case r.exit.Status == client.StatusTimedOut:
			// Whatever its report says, the tests after the cut did not run.
			bad = append(bad, fmt.Sprintf("shard %d: the command ran past --timeout %s", i+1, time.Duration(o.timeout)))
		case r.exit.Status != client.StatusExited || r.exit.ExitCode != 0:
			switch {
			case r.suites == nil:
				bad = append(bad, fmt.Sprintf("shard %d: the command ended %s (exit code %d) without a JUnit report", i+1, r.exit.Status, r.exit.ExitCode))
			case sfail == 0:
				// pytest's 2 to 5 (interrupted, internal error, usage, no
				// tests), a crash in teardown: not a pass.
				bad = append(bad, fmt.Sprintf("shard %d: the command ended %s (exit code %d) though its report has no failure", i+1, r.exit.Status, r.exit.ExitCode))
			}
		}
		for _, s := range r.suites {
			tests, failed, errored, skipped = tests+s.Tests, failed+s.Failures, errored+s.Errors, skipped+s.Skipped
			merged.Suites = append(merged.Suites, s)
		}
	}
	if err := writeJUnit(o.junitOut, merged); err != nil {
		return err
	}
	if err := writeDurations(o.durations, durations, merged, files); err != nil {
		return err
	}
	fmt.Fprintf(errw, "shard: %d tests, %d failed, %d errors, %d skipped in %s across %d shards; report %s\n",
		tests, failed, errored, skipped, time.Since(start).Round(time.Millisecond), len(parts), o.junitOut)
	if len(bad) > 0 {
		return &exitError{code: ExitError, msg: strings.Join(bad, "; ")}
	}
	if failed+errored > 0 {
		return &exitError{code: ExitError, msg: fmt.Sprintf("%d of %d tests failed or errored", failed+errored, tests)}
	}
	return nil
}

// oneShard runs one part of the files in a fresh sandbox, deleted before
// it returns (also when ctx ends).
func oneShard(ctx context.Context, c *client.Client, o shardOpts, env map[string]string, argv []string, runID string, i int, part []string, out, errOut io.Writer) shardResult {
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: o.template, Runtime: o.runtime,
		Timeout: wholeSeconds(time.Duration(o.timeout)) + 120, WaitSeconds: 600,
		Metadata: map[string]string{"via": "evalbox-shard", "shard": strconv.Itoa(i + 1), "evalbox-shard-run": runID}})
	if err != nil {
		return shardResult{err: err}
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := c.DeleteSandbox(dctx, sb.ID); err != nil && !client.IsNotFound(err) {
			fmt.Fprintf(errOut, "delete sandbox %s: %v\n", sb.ID, err)
		}
	}()
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeTarSkipping(pw, o.dir, []string{"."}, func(_ string, d fs.DirEntry) bool {
			return d.IsDir() && skipDir[d.Name()]
		}))
	}()
	_, err = c.WriteFile(ctx, sb.ID, shardArchive, pr, -1, 0o600)
	pr.CloseWithError(err)
	if err != nil {
		return shardResult{err: fmt.Errorf("upload the project: %w", err)}
	}
	if r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", `mkdir -p "$1" && tar -xf "$2" -C "$1" && rm -f "$2"`, "sh", shardWorkdir, shardArchive}}); err != nil {
		return shardResult{err: fmt.Errorf("unpack the project: %w", err)}
	} else if r.ExitCode != 0 {
		return shardResult{err: fmt.Errorf("unpack the project: %s", strings.TrimSpace(r.Stderr))}
	}
	run := append(slices.Clone(argv), part...)
	run = append(run, strings.ReplaceAll(o.junitArg, "{}", shardJUnit))
	res, err := c.ExecStream(ctx, sb.ID, client.ExecRequest{Argv: run, Cwd: shardWorkdir, Env: env,
		Timeout: time.Duration(o.timeout).Seconds()}, out, errOut)
	if err != nil {
		return shardResult{err: err}
	}
	rc, _, err := c.ReadFile(ctx, sb.ID, shardJUnit)
	if client.IsNotFound(err) {
		return shardResult{exit: res}
	}
	if err != nil {
		return shardResult{err: fmt.Errorf("read its report: %w", err)}
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 256<<20))
	if err != nil {
		return shardResult{err: fmt.Errorf("read its report: %w", err)}
	}
	suites, err := parseJUnit(b)
	if err != nil {
		return shardResult{err: fmt.Errorf("its report: %w", err)}
	}
	if suites == nil {
		suites = []junitSuite{}
	}
	return shardResult{suites: suites, exit: res}
}

func writeJUnit(p string, r junitSuites) error {
	b, err := xml.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, append([]byte(xml.Header), append(b, '\n')...), 0o644)
}

// writeDurations records each test file's time in the merged report, over
// the old record (files that did not run keep theirs).
func writeDurations(p string, old map[string]float64, r junitSuites, files []string) error {
	out := map[string]float64{}
	for f, d := range old {
		out[f] = d
	}
	ran := map[string]float64{}
	for _, s := range r.Suites {
		for _, tc := range s.Cases {
			if f := fileOf(tc, files); f != "" {
				ran[f] += tc.Time
			}
		}
	}
	for f, d := range ran {
		out[f] = d
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, append(b, '\n'), 0o644)
}

// fileOf is the test file a test case came from: its file attribute, or
// the file whose module path its class name starts with (pytest's
// "tests.test_a.TestX").
func fileOf(tc junitCase, files []string) string {
	if tc.File != "" {
		return tc.File
	}
	best := ""
	for _, f := range files {
		mod := strings.ReplaceAll(strings.TrimSuffix(f, path.Ext(f)), "/", ".")
		if (tc.Classname == mod || strings.HasPrefix(tc.Classname, mod+".")) && len(f) > len(best) {
			best = f
		}
	}
	return best
}

// prefixWriter writes whole lines to w, each with prefix, one writer at a
// time (mu). A line longer than maxPrefixLine is written in pieces of that
// size, each prefixed; Flush writes what is left of the last line.
type prefixWriter struct {
	w      io.Writer
	mu     *sync.Mutex
	prefix string
	buf    []byte
}

// maxPrefixLine bounds what a prefixWriter holds of one line.
const maxPrefixLine = 64 << 10

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		var err error
		switch i := slices.Index(p.buf, '\n'); {
		case i >= 0:
			err = p.line(p.buf[:i])
			p.buf = p.buf[i+1:]
		case len(p.buf) >= maxPrefixLine:
			err = p.line(p.buf[:maxPrefixLine])
			p.buf = p.buf[maxPrefixLine:]
		default:
			return len(b), nil
		}
		if err != nil {
			return len(b), err
		}
	}
}

func (p *prefixWriter) line(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, b)
	return err
}

// Flush writes the last line if it did not end with a newline.
func (p *prefixWriter) Flush() {
	if len(p.buf) > 0 {
		_ = p.line(p.buf)
		p.buf = nil
	}
}

// newRunID is a random id that tags one run's sandboxes.
func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
