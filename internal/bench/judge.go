package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/pkg/client"
)

// twice are, per language, programs that read n and print 2n: the trials
// of `bench judge`.
var twice = map[string]string{
	"python":     "n = int(input())\nprint(2 * n)\n",
	"c":          "#include <stdio.h>\nint main(void) { long long n; if (scanf(\"%lld\", &n) != 1) return 1; printf(\"%lld\\n\", 2 * n); return 0; }\n",
	"cpp":        "#include <iostream>\nint main() { long long n; std::cin >> n; std::cout << 2 * n << '\\n'; }\n",
	"java":       "import java.util.*;\npublic class Main {\n  public static void main(String[] a) { Scanner s = new Scanner(System.in); System.out.println(2 * s.nextLong()); }\n}\n",
	"nodejs":     "const n = BigInt(require('fs').readFileSync(0, 'utf8').trim());\nconsole.log((2n * n).toString());\n",
	"typescript": "import * as fs from 'fs';\nconst n: number = parseInt(fs.readFileSync(0, 'utf8'), 10);\nconsole.log(2 * n);\n",
	"go":         "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tvar n int64\n\tfmt.Scan(&n)\n\tfmt.Println(2 * n)\n}\n",
	"rust":       "use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap(); let n: i64 = s.trim().parse().unwrap(); println!(\"{}\", 2 * n); }\n",
	"bash":       "read n\necho $((2 * n))\n",
}

type judgeOpts struct {
	runtimes     []string
	languages    []string
	trials       int
	tests        int
	samples      int
	throughput   string
	concurrency  int
	timeout      float64
	templatesDir string
	json         bool
}

func judgeCommand() *cobra.Command {
	var o judgeOpts
	cmd := &cobra.Command{
		Use:   "judge",
		Short: "Stdin/stdout judging per language: overhead per trial against native, and trials/s",
		Long: `Two measures of stdin/stdout judging (eval runs with tests), side by side
in one run.

Per language: --trials samples of a program that reads n and prints 2n,
each judged on --tests tests, one trial at a time: natively (the host's
toolchain in a temporary directory: compile once, run each test; a language
whose toolchain the host lacks is n/a) and as an eval run on each runtime
(a fresh sandbox per sample of the language's template: create, write,
compile, run each test, delete). The host's toolchains may be other versions
than the template's (e.g. Node.js, Go): the table says which ran.

Throughput: --samples samples of --throughput-language on --tests tests
each, at --concurrency (default 2 per core), natively (a pool of as many
workers) and as an eval run on each runtime.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runJudgeBench(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.runtimes, "runtimes", []string{client.RuntimeNamespaces, client.RuntimeGVisor}, "runtimes to judge on")
	f.StringSliceVar(&o.languages, "languages", lang.Names(), "languages of the overhead table")
	f.IntVar(&o.trials, "trials", 5, "trials per language and way in the overhead table")
	f.IntVar(&o.tests, "tests", 10, "tests per sample")
	f.IntVar(&o.samples, "samples", 500, "samples of the throughput run (0: none)")
	f.StringVar(&o.throughput, "throughput-language", "python", "language of the throughput run")
	f.IntVar(&o.concurrency, "concurrency", 0, "trials at a time in the throughput run (default 2 per core)")
	f.Float64Var(&o.timeout, "timeout", 10, "per-test time limit in seconds")
	f.StringVar(&o.templatesDir, "templates-dir", "/var/lib/evalbox/templates", "template directory (built by evalbox template init: python, base, node, polyglot)")
	f.BoolVar(&o.json, "json", false, "print JSON instead of tables")
	return cmd
}

// langRow is one language's overhead: ms per trial by way.
type langRow struct {
	Language string             `json:"language"`
	Native   float64            `json:"native_ms"`
	NativeTC string             `json:"native_toolchain"`
	Ways     map[string]float64 `json:"ms"`
	// Compile and Run split the sandboxed trials' time: the compile, and
	// every test's run (the rest is the sandbox's create, writes and delete).
	Compile map[string]float64 `json:"compile_ms"`
	Run     map[string]float64 `json:"run_ms"`
	Passed  map[string]int     `json:"passed"`
}

// throughputRow is one way's throughput run.
type throughputRow struct {
	Way    string  `json:"way"`
	Trials int     `json:"trials"`
	WallS  float64 `json:"wall_s"`
	PerS   float64 `json:"trials_per_s"`
	Passed int     `json:"passed"`
}

type judgeReport struct {
	Host        string          `json:"host"`
	Cores       int             `json:"cores"`
	Date        string          `json:"date"`
	Tests       int             `json:"tests"`
	Trials      int             `json:"trials"`
	Languages   []langRow       `json:"languages"`
	Concurrency int             `json:"concurrency"`
	Throughput  []throughputRow `json:"throughput"`
	ThroughLang string          `json:"throughput_language"`
}

// judgeTests are n tests of "print 2n".
func judgeTests(n int) []client.EvalTest {
	out := make([]client.EvalTest, n)
	for i := range out {
		v := int64(i*7919 - 1000)
		out[i] = client.EvalTest{Input: fmt.Sprintf("%d\n", v), Output: fmt.Sprintf("%d\n", 2*v)}
	}
	return out
}

func runJudgeBench(ctx context.Context, w, logw io.Writer, o judgeOpts) error {
	if o.trials < 1 || o.tests < 1 || o.samples < 0 {
		return fmt.Errorf("--trials and --tests must be positive, --samples not negative")
	}
	for _, name := range append(slices.Clone(o.languages), o.throughput) {
		if _, ok := twice[name]; !ok {
			return fmt.Errorf("no benchmark program in %q (have %s)", name, strings.Join(lang.Names(), ", "))
		}
	}
	if o.concurrency == 0 {
		o.concurrency = 2 * runtime.NumCPU()
	}
	host, _ := os.Hostname()
	rep := judgeReport{Host: host, Cores: runtime.NumCPU(), Date: time.Now().UTC().Format("2006-01-02"), Tests: o.tests, Trials: o.trials,
		Concurrency: o.concurrency, ThroughLang: o.throughput}
	s, err := startServer(ctx, o.templatesDir)
	if err != nil {
		return err
	}
	defer s.stop()
	tests := judgeTests(o.tests)
	for _, name := range o.languages {
		l, _ := lang.Lookup(name)
		row := langRow{Language: l.Name, Ways: map[string]float64{}, Compile: map[string]float64{}, Run: map[string]float64{}, Passed: map[string]int{}}
		fmt.Fprintf(logw, "bench judge: %s natively\n", l.Name)
		if ms, tc, err := nativeTrials(ctx, l, twice[name], tests, o.trials, o.timeout); err != nil {
			row.NativeTC = "n/a: " + err.Error()
		} else {
			row.Native, row.NativeTC = ms, tc
		}
		for _, rt := range o.runtimes {
			fmt.Fprintf(logw, "bench judge: %s on %s\n", l.Name, rt)
			rs, wall, err := judgeRun(ctx, s.c, rt, l.Name, twice[name], tests, o.trials, 1, o.timeout)
			if err != nil {
				return fmt.Errorf("%s on %s: %w", l.Name, rt, err)
			}
			var compile, run float64
			for _, r := range rs {
				if r.Compile != nil {
					compile += float64(r.Compile.DurationMs)
				}
				for _, t := range r.Tests {
					run += float64(t.DurationMs)
				}
				if r.Passed {
					row.Passed[rt]++
				}
			}
			n := float64(len(rs))
			row.Ways[rt], row.Compile[rt], row.Run[rt] = msf(wall)/n, compile/n, run/n
		}
		rep.Languages = append(rep.Languages, row)
	}
	if o.samples > 0 {
		l, _ := lang.Lookup(o.throughput)
		fmt.Fprintf(logw, "bench judge: throughput, %d samples of %s natively\n", o.samples, l.Name)
		start := time.Now()
		passed, err := nativeThroughput(ctx, l, twice[o.throughput], tests, o.samples, o.concurrency, o.timeout)
		if err != nil {
			return fmt.Errorf("native throughput: %w", err)
		}
		wall := time.Since(start)
		rep.Throughput = append(rep.Throughput, throughputRow{Way: "native", Trials: o.samples, WallS: wall.Seconds(), PerS: float64(o.samples) / wall.Seconds(), Passed: passed})
		for _, rt := range o.runtimes {
			fmt.Fprintf(logw, "bench judge: throughput on %s\n", rt)
			rs, wall, err := judgeRun(ctx, s.c, rt, l.Name, twice[o.throughput], tests, o.samples, o.concurrency, o.timeout)
			if err != nil {
				return fmt.Errorf("throughput on %s: %w", rt, err)
			}
			row := throughputRow{Way: rt, Trials: len(rs), WallS: wall.Seconds(), PerS: float64(len(rs)) / wall.Seconds()}
			for _, r := range rs {
				if r.Passed {
					row.Passed++
				}
			}
			rep.Throughput = append(rep.Throughput, row)
		}
	}
	if o.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printJudge(w, rep, o.runtimes)
}

// judgeRun runs n samples of src in language on runtime rt as one eval run
// at concurrency conc, and returns their results and the run's wall time.
func judgeRun(ctx context.Context, c *client.Client, rt, language, src string, tests []client.EvalTest, n, conc int, timeout float64) ([]client.EvalResult, time.Duration, error) {
	req := client.CreateEvalRequest{Runtime: rt, Language: language, Timeout: timeout, Concurrency: conc,
		Problems: []client.EvalProblem{{TaskID: "twice", Tests: tests}}}
	for range n {
		req.Samples = append(req.Samples, client.EvalSample{TaskID: "twice", Solution: &src})
	}
	start := time.Now()
	run, err := c.CreateEval(ctx, req)
	if err != nil {
		return nil, 0, err
	}
	err = c.EvalProgressEvents(ctx, run.ID, func(ev client.EvalEvent) error {
		if ev.Type == client.EvalEventEnd {
			run = ev.Run
		}
		return nil
	})
	wall := time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			_, _ = c.CancelEval(context.WithoutCancel(ctx), run.ID)
		}
		return nil, 0, err
	}
	if run.State != client.EvalStateSucceeded {
		return nil, 0, fmt.Errorf("eval run %s ended %s: %s", run.ID, run.State, run.Error)
	}
	var rs []client.EvalResult
	err = c.EvalResults(ctx, run.ID, func(r client.EvalResult) error { rs = append(rs, r); return nil })
	if err == nil && len(rs) != n {
		err = fmt.Errorf("%d results for %d samples", len(rs), n)
	}
	for _, r := range rs {
		if r.Status == client.TestInfraError || r.Status == client.CompileError {
			return nil, 0, fmt.Errorf("sample %d: %s: %s", r.CompletionID, r.Status, r.Detail)
		}
	}
	return rs, wall, err
}

// nativeTrials judges src natively n times, one after the other, and
// returns the mean ms per trial and the host toolchain's version.
func nativeTrials(ctx context.Context, l lang.Language, src string, tests []client.EvalTest, n int, timeout float64) (float64, string, error) {
	tool := l.Run[0]
	if l.Compiled() {
		tool = l.Compile[0]
	}
	path, err := lookTool(tool)
	if err != nil {
		return 0, "", err
	}
	version := toolVersion(ctx, path)
	start := time.Now()
	for range n {
		ok, err := nativeTrial(ctx, l, src, tests, timeout)
		if err != nil {
			return 0, version, err
		}
		if ok != len(tests) {
			return 0, version, fmt.Errorf("%d of %d tests passed natively", ok, len(tests))
		}
	}
	return msf(time.Since(start)) / float64(n), version, nil
}

// lookTool finds a toolchain's command: Debian's (/usr/bin, as in the
// templates) before the rest of PATH (e.g. pyenv's shims, which start a
// shell first).
func lookTool(name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	if p := "/usr/bin/" + name; isExecutable(p) {
		return p, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("no %s on this host", name)
	}
	return p, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// toolVersion is the first line of a toolchain's version.
func toolVersion(ctx context.Context, path string) string {
	for _, arg := range []string{"--version", "version", "-version"} {
		out, err := exec.CommandContext(ctx, path, arg).CombinedOutput()
		if err == nil {
			line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
			return filepath.Base(path) + ": " + line
		}
	}
	return filepath.Base(path)
}

// nativeThroughput judges n samples natively with conc workers and returns
// how many passed.
func nativeThroughput(ctx context.Context, l lang.Language, src string, tests []client.EvalTest, n, conc int, timeout float64) (int, error) {
	var (
		mu       sync.Mutex
		passed   int
		firstErr error
		wg       sync.WaitGroup
	)
	next := make(chan struct{})
	for range conc {
		wg.Go(func() {
			for range next {
				ok, err := nativeTrial(ctx, l, src, tests, timeout)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && ok == len(tests) {
					passed++
				}
				mu.Unlock()
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	return passed, firstErr
}

// nativeTrial compiles src in a fresh temporary directory and runs it on
// each test, and returns how many tests it passed (tokens compared).
func nativeTrial(ctx context.Context, l lang.Language, src string, tests []client.EvalTest, timeout float64) (int, error) {
	dir, err := os.MkdirTemp("", "evalbox-judge-native-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	file, class := l.SourceFile(src)
	if err := os.WriteFile(filepath.Join(dir, file), []byte(src), 0o644); err != nil {
		return 0, err
	}
	// The host's environment (its HOME: rustup's toolchains, Go's build
	// cache, which holds the host Go's standard library, built once).
	env := os.Environ()
	for _, kv := range l.EnvList() {
		if _, v, _ := strings.Cut(kv, "="); strings.HasPrefix(v, "/tmp/") {
			continue // the host's own caches (above)
		}
		env = append(env, kv)
	}
	if l.Compiled() {
		argv := l.CompileArgv(file, nil)
		if argv[0], err = lookTool(argv[0]); err != nil {
			return 0, err
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("compile: %v: %s", err, lastLines(string(out), 3))
		}
	}
	passed := 0
	argv := l.RunArgvLimited(file, class, 512)
	if !strings.HasPrefix(argv[0], "./") {
		if argv[0], err = lookTool(argv[0]); err != nil {
			return 0, err
		}
	}
	for _, tc := range tests {
		tctx, cancel := context.WithTimeout(ctx, time.Duration(timeout*float64(time.Second)))
		cmd := exec.CommandContext(tctx, argv[0], argv[1:]...)
		cmd.Dir, cmd.Env, cmd.Stdin = dir, env, strings.NewReader(tc.Input)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		var out bytes.Buffer
		cmd.Stdout = &out
		err := cmd.Run()
		cancel()
		if err == nil && slices.Equal(strings.Fields(out.String()), strings.Fields(tc.Output)) {
			passed++
		}
	}
	return passed, nil
}

func printJudge(w io.Writer, rep judgeReport, runtimes []string) error {
	fmt.Fprintf(w, "evalbox bench judge — %s, %d cores, %s; %d tests per sample\n\n", rep.Host, rep.Cores, rep.Date, rep.Tests)
	fmt.Fprintf(w, "Overhead per trial (compile once, run every test), ms, mean of %d trials one at a time:\n\n", rep.Trials)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	head := "| language\t| native\t"
	sep := "|---\t|---\t"
	for _, rt := range runtimes {
		head += fmt.Sprintf("| %s\t| × native\t| compile\t| runs\t", rt)
		sep += "|---\t|---\t|---\t|---\t"
	}
	fmt.Fprintln(tw, head+"| native toolchain\t|")
	fmt.Fprintln(tw, sep+"|---\t|")
	for _, r := range rep.Languages {
		native := "n/a"
		if r.Native > 0 {
			native = fmt.Sprintf("%.0f", r.Native)
		}
		line := fmt.Sprintf("| %s\t| %s\t", r.Language, native)
		for _, rt := range runtimes {
			ratio := ""
			if r.Native > 0 {
				ratio = fmt.Sprintf("%.2f", r.Ways[rt]/r.Native)
			}
			line += fmt.Sprintf("| %.0f\t| %s\t| %.0f\t| %.0f\t", r.Ways[rt], ratio, r.Compile[rt], r.Run[rt])
		}
		fmt.Fprintln(tw, line+"| "+r.NativeTC+"\t|")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Throughput) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nThroughput: %s samples × %d tests, concurrency %d:\n\n", rep.ThroughLang, rep.Tests, rep.Concurrency)
	fmt.Fprintln(tw, "| way\t| trials\t| wall s\t| trials/s\t| × native\t| passed\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|")
	native := rep.Throughput[0].PerS
	for _, r := range rep.Throughput {
		fmt.Fprintf(tw, "| %s\t| %d\t| %.1f\t| %.1f\t| %.2f\t| %d\t|\n", r.Way, r.Trials, r.WallS, r.PerS, r.PerS/native, r.Passed)
	}
	return tw.Flush()
}
