package eval

// LiveCodeBench records, with their compressed private tests.

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// lcbTest is one of LiveCodeBench's test cases.
type lcbTest struct {
	Input    string `json:"input"`
	Output   string `json:"output"`
	TestType string `json:"testtype"`
}

// liveCodeBenchProblem: stdin tests become stdin/stdout tests; functional
// ones (metadata's func_name) I/O cases (an argument a line, each a JSON
// value) on the wrapper, with LiveCodeBench's imports before the program.
func (s FormatSpec) liveCodeBenchProblem(f fields, rec record) (Problem, error) {
	id, err := f.taskID(rec, "question_id")
	if err != nil {
		return Problem{}, err
	}
	p := Problem{TaskID: id}
	var tests []lcbTest
	if s.wants("public") {
		raw, err := f.nested("public_test_cases")
		if err != nil {
			return p, err
		}
		if raw != nil {
			if err := json.Unmarshal(raw, &tests); err != nil {
				return p, fmt.Errorf("public_test_cases: want a list of {input, output, testtype}: %w", err)
			}
		}
	}
	if s.wants("private") {
		priv, err := lcbPrivate(f)
		if err != nil {
			return p, err
		}
		tests = append(tests, priv...)
	}
	if len(tests) == 0 {
		return p, fmt.Errorf("no tests in %s", strings.Join(setFields(s, "_test_cases"), " or "))
	}
	fn := ""
	if meta, err := f.nested("metadata"); err != nil {
		return p, err
	} else if meta != nil {
		var m struct {
			FuncName string `json:"func_name"`
		}
		if err := json.Unmarshal(meta, &m); err != nil {
			return p, fmt.Errorf("metadata: want an object: %w", err)
		}
		fn = m.FuncName
	}
	want := "stdin"
	if fn != "" {
		want = "functional"
	}
	for i, t := range tests {
		if t.TestType != want {
			return p, fmt.Errorf("test %d: testtype %q, but the problem is %s (metadata's func_name %q)", i, t.TestType, want, fn)
		}
	}
	if fn == "" {
		for _, t := range tests {
			p.Tests = append(p.Tests, Test{Input: t.Input, Output: t.Output})
		}
		p.Checker = s.Checker
		return p, nil
	}
	p.Language = pythonLang
	p.EntryPoint = entryWrapper
	p.Prompt = lcbPrelude + wrapperPy(fn, false)
	for i, t := range tests {
		c := IOCase{Input: []json.RawMessage{}}
		for j, line := range strings.Split(strings.TrimSuffix(t.Input, "\n"), "\n") {
			if !json.Valid([]byte(line)) {
				return p, fmt.Errorf("test %d: input line %d is not a JSON value", i, j+1)
			}
			c.Input = append(c.Input, json.RawMessage(line))
		}
		if !json.Valid([]byte(t.Output)) {
			return p, fmt.Errorf("test %d: output is not a JSON value", i)
		}
		c.Output = json.RawMessage(t.Output)
		p.IO = append(p.IO, c)
	}
	return p, nil
}

// lcbPrivate reads private_test_cases: a JSON list, or (code_generation
// _lite) the base64 of zlib of a pickle of that JSON's text.
func lcbPrivate(f fields) ([]lcbTest, error) {
	const k = "private_test_cases"
	s, err := f.str(k)
	if err != nil || strings.TrimSpace(s) == "" {
		if kind(f[k]) == "an array" {
			var ts []lcbTest
			if err := json.Unmarshal(f[k], &ts); err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			return ts, nil
		}
		return nil, err
	}
	var ts []lcbTest
	if json.Unmarshal([]byte(s), &ts) == nil {
		return ts, nil
	}
	text, err := unpackLCB(s)
	if err != nil {
		return nil, fmt.Errorf("%s: neither JSON nor base64(zlib(pickle)): %w", k, err)
	}
	if err := json.Unmarshal([]byte(text), &ts); err != nil {
		return nil, fmt.Errorf("%s: the unpickled string is not a list of {input, output, testtype}: %w", k, err)
	}
	return ts, nil
}

// unpackLCB undoes base64, then zlib, then a pickle of one str.
func unpackLCB(s string) (string, error) {
	z, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("base64: %w", err)
	}
	zr, err := zlib.NewReader(bytes.NewReader(z))
	if err != nil {
		return "", fmt.Errorf("zlib: %w", err)
	}
	defer zr.Close()
	data, err := io.ReadAll(io.LimitReader(zr, maxDocument+1))
	if err != nil {
		return "", fmt.Errorf("zlib: %w", err)
	}
	if len(data) > maxDocument {
		return "", fmt.Errorf("zlib: more than %d bytes", maxDocument)
	}
	return unpickleString(data)
}

// Pickle opcodes unpickleString takes.
const (
	pkProto      = 0x80
	pkFrame      = 0x95
	pkShortUni   = 0x8c // SHORT_BINUNICODE: 1-byte length
	pkBinUni     = 'X'  // BINUNICODE: 4-byte length
	pkBinUni8    = 0x8d // BINUNICODE8: 8-byte length
	pkMemoize    = 0x94
	pkBinPut     = 'q'
	pkLongBinPut = 'r'
	pkStop       = '.'
)

// unpickleString reads a pickle (protocol 2 to 5) of exactly one str and
// refuses anything else: it never builds other objects, so it runs no
// code a pickle could ask for.
func unpickleString(b []byte) (string, error) {
	var (
		out    string
		got    bool
		memo   bool
		i      int
		nbytes = func(n uint64) ([]byte, error) {
			if n > uint64(len(b)-i) {
				return nil, errors.New("pickle: truncated")
			}
			v := b[i : i+int(n)]
			i += int(n)
			return v, nil
		}
	)
	for i < len(b) {
		op := b[i]
		i++
		switch op {
		case pkProto:
			v, err := nbytes(1)
			if err != nil {
				return "", err
			}
			if i != 2 || v[0] < 2 || v[0] > 5 {
				return "", fmt.Errorf("pickle: protocol %d at byte %d (want 2 to 5, first)", v[0], i-2)
			}
		case pkFrame:
			v, err := nbytes(8)
			if err != nil {
				return "", err
			}
			if binary.LittleEndian.Uint64(v) > uint64(len(b)-i) {
				return "", errors.New("pickle: frame past the end")
			}
		case pkShortUni, pkBinUni, pkBinUni8:
			if got {
				return "", errors.New("pickle: more than one object (want one str)")
			}
			width := map[byte]uint64{pkShortUni: 1, pkBinUni: 4, pkBinUni8: 8}[op]
			v, err := nbytes(width)
			if err != nil {
				return "", err
			}
			var n uint64
			switch width {
			case 1:
				n = uint64(v[0])
			case 4:
				n = uint64(binary.LittleEndian.Uint32(v))
			default:
				n = binary.LittleEndian.Uint64(v)
			}
			s, err := nbytes(n)
			if err != nil {
				return "", err
			}
			if !utf8.Valid(s) {
				return "", errors.New("pickle: the str is not valid UTF-8")
			}
			out, got = string(s), true
		case pkMemoize, pkBinPut, pkLongBinPut:
			if !got || memo {
				return "", fmt.Errorf("pickle: opcode 0x%02x at byte %d out of place", op, i-1)
			}
			memo = true
			if _, err := nbytes(map[byte]uint64{pkMemoize: 0, pkBinPut: 1, pkLongBinPut: 4}[op]); err != nil {
				return "", err
			}
		case pkStop:
			if !got {
				return "", errors.New("pickle: no str before STOP")
			}
			if i != len(b) {
				return "", errors.New("pickle: data after STOP")
			}
			return out, nil
		default:
			return "", fmt.Errorf("pickle: opcode 0x%02x at byte %d: only one str is read", op, i-1)
		}
	}
	return "", errors.New("pickle: no STOP")
}
