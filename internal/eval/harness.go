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
// after another, each written to Path and run as `python3 Path` with the
// timeout (seconds), as User.
type HarnessInput struct {
	// Nonce marks the harness's own result lines; the programs never see
	// it.
	Nonce   string  `json:"nonce"`
	Timeout float64 `json:"timeout"`
	Path    string  `json:"path"`
	// User is the uid (and gid) the programs run as when the harness runs
	// as root; 0 keeps the harness's.
	User      int              `json:"user"`
	StdoutCap int              `json:"stdout_cap"`
	StderrCap int              `json:"stderr_cap"`
	Programs  []HarnessProgram `json:"programs"`
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
