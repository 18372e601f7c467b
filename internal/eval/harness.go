package eval

import (
	"bytes"
	_ "embed"
	"encoding/json"
)

//go:embed harness.py
var harnessSource string

// HarnessArgv is the command that runs the batch harness in a sandbox
// (python3 in isolated mode, the source given inline); its input is a
// HarnessInput as JSON on stdin.
func HarnessArgv() []string {
	return []string{"python3", "-I", "-c", harnessSource}
}

// Per-program output caps of the batch harness: the head of stdout (read
// in I/O mode only) and the tail of stderr (where the traceback is).
const (
	HarnessStdoutCap = 1 << 20
	HarnessStderrCap = 16 << 10
)

// HarnessInput is a slice for the batch harness: the programs to run one
// after another, each written to Dir/File (a directory only the harness may
// write to) and run as `python3 Dir/File` with the timeout (seconds), as
// User.
// Between two programs the harness kills every process of User and undoes
// what the program did in the places it could write to (harness.py says
// how), so that no program changes another's verdict.
type HarnessInput struct {
	// Nonce marks the harness's own result lines; the programs never see
	// it.
	Nonce   string  `json:"nonce"`
	Timeout float64 `json:"timeout"`
	Dir     string  `json:"dir"`
	File    string  `json:"file"`
	// User is the uid (and gid) the programs run as when the harness runs
	// as root; 0 keeps the harness's.
	User      int              `json:"user"`
	StdoutCap int              `json:"stdout_cap"`
	StderrCap int              `json:"stderr_cap"`
	Programs  []HarnessProgram `json:"programs"`
	// Scan asks the harness to find, before any program runs, the
	// directories and files User may write to, and to report them in a
	// line (HarnessLine.Scan) for the next slices of the same template.
	Scan bool `json:"scan,omitempty"`
	// Writable is an earlier scan of the same template and runtime.
	Writable *HarnessScan `json:"writable,omitempty"`
	// Sandboxed says the harness has a sandbox of its own: it then also
	// restores the directories every sandbox lets anyone write to (/tmp,
	// /var/tmp, /dev/shm, …) and the System V IPC objects (never set it for
	// a harness run on a host: these would be the host's).
	Sandboxed bool `json:"sandboxed,omitempty"`
}

// HarnessScan is what a program's user may write to in a sandbox of a
// template: the places the harness restores after each program.
type HarnessScan struct {
	Dirs  []string `json:"dirs"`
	Files []string `json:"files"`
}

// HarnessProgram is one program of a slice; ID comes back in its lines.
type HarnessProgram struct {
	ID     int    `json:"id"`
	Source string `json:"source"`
}

// HarnessLine is one line of the harness's output: Start before a program
// runs, then its result.
type HarnessLine struct {
	Nonce           string `json:"n"`
	ID              int    `json:"i"`
	Start           bool   `json:"start"`
	Status          string `json:"status"`
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal"`
	Stdout          string `json:"stdout"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	Stderr          string `json:"stderr"`
	Error           string `json:"error"`
	DurationMs      int64  `json:"ms"`
	// Scan is set on the line that reports a scan (HarnessInput.Scan),
	// which comes before any program's.
	Scan *HarnessScan `json:"scan,omitempty"`
}

// Run is the program's run as a trial's exec would have reported it.
func (l HarnessLine) Run() Run {
	return Run{Status: l.Status, ExitCode: l.ExitCode, Signal: l.Signal, Stdout: l.Stdout, Stderr: l.Stderr, Error: l.Error}
}

// maxHarnessLine bounds one result line (the caps, JSON escaped, and more).
const maxHarnessLine = 8 * (HarnessStdoutCap + HarnessStderrCap)

// HarnessReaderMemory bounds what a HarnessReader holds: the line being
// read (its buffer grows to at most twice the longest line) and the
// strings of the line it parses.
const HarnessReaderMemory = 2*maxHarnessLine + HarnessStdoutCap + HarnessStderrCap

// HarnessReader is an io.Writer for the harness's stdout: it calls Line
// for every complete line that parses and carries Nonce, in order, and
// drops anything else (a program cannot print here, but it might forge
// lines by other means; without the nonce they are ignored).
type HarnessReader struct {
	Nonce string
	Line  func(HarnessLine)
	buf   []byte
	skip  bool // the current line is too long and is being dropped
}

// Write implements io.Writer; it never fails.
func (h *HarnessReader) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if !h.skip {
				h.buf = append(h.buf, p...)
				if len(h.buf) > maxHarnessLine {
					h.buf, h.skip = h.buf[:0], true
				}
			}
			break
		}
		if !h.skip {
			line := p[:i]
			if len(h.buf) > 0 {
				h.buf = append(h.buf, line...)
				line = h.buf
			}
			h.parse(line)
		}
		h.buf, h.skip = h.buf[:0], false
		p = p[i+1:]
	}
	return n, nil
}

func (h *HarnessReader) parse(line []byte) {
	var l HarnessLine
	if json.Unmarshal(line, &l) != nil || l.Nonce != h.Nonce || h.Nonce == "" {
		return
	}
	h.Line(l)
}
