package cli

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestSplitFiles: the longest files first, each to the least loaded shard;
// unknown files count as the mean; never more shards than files.
func TestSplitFiles(t *testing.T) {
	files := []string{"a", "b", "c", "d", "e"}
	got := splitFiles(files, 2, map[string]float64{"a": 10, "b": 1, "c": 1, "d": 1})
	if fmt.Sprint(got) != "[[a] [b c d e]]" {
		t.Errorf("by durations: %v", got)
	}
	got = splitFiles(files, 3, nil)
	if len(got) != 3 || len(got[0])+len(got[1])+len(got[2]) != 5 || len(got[0]) != 2 {
		t.Errorf("by count: %v", got)
	}
	if got = splitFiles([]string{"a"}, 4, nil); len(got) != 1 {
		t.Errorf("one file, 4 shards: %v", got)
	}
	// Files recorded as taking no time still go one to a shard first:
	// an empty shard would run the whole suite.
	got = splitFiles(files, 4, map[string]float64{"a": 1.5, "b": 0.001, "c": 0, "d": 0, "e": 0})
	for i, s := range got {
		if len(s) == 0 {
			t.Errorf("shard %d is empty: %v", i, got)
		}
	}
	var all []string
	for _, s := range splitFiles(files, 4, map[string]float64{"e": 3}) {
		all = append(all, s...)
	}
	slices.Sort(all)
	if !slices.Equal(all, files) {
		t.Errorf("files lost or doubled: %v", all)
	}
}

// TestFileOf: a test case's file, from its file attribute or its class
// name's module path (the longest match).
func TestFileOf(t *testing.T) {
	files := []string{"test_a.py", "tests/test_b.py", "tests/sub/test_b.py"}
	for tc, want := range map[junitCase]string{
		{Classname: "test_a"}:                     "test_a.py",
		{Classname: "tests.sub.test_b.TestX"}:     "tests/sub/test_b.py",
		{Classname: "tests.test_b"}:               "tests/test_b.py",
		{Classname: "test_ab"}:                    "",
		{Classname: "x", File: "given/test_c.py"}: "given/test_c.py",
	} {
		if got := fileOf(tc, files); got != want {
			t.Errorf("%+v: %q, want %q", tc, got, want)
		}
	}
}

// TestParseJUnit: both report forms; anything else is an error.
func TestParseJUnit(t *testing.T) {
	many := `<testsuites><testsuite name="a" tests="2" failures="1"><testcase classname="m" name="t1" time="0.5"/>` +
		`<testcase classname="m" name="t2"><failure message="no">trace</failure></testcase></testsuite></testsuites>`
	s, err := parseJUnit([]byte(many))
	if err != nil || len(s) != 1 || s[0].Tests != 2 || len(s[0].Cases) != 2 || s[0].Cases[1].Failure == nil || s[0].Cases[0].Time != 0.5 {
		t.Errorf("testsuites: %+v %v", s, err)
	}
	s, err = parseJUnit([]byte(`<testsuite name="b" tests="1"><testcase classname="m" name="t"/></testsuite>`))
	if err != nil || len(s) != 1 || s[0].Name != "b" {
		t.Errorf("testsuite: %+v %v", s, err)
	}
	if _, err := parseJUnit([]byte("not xml")); err == nil {
		t.Error("not XML: no error")
	}
}

// TestPrefixWriter: whole lines get the prefix, however the writes split
// them; a line past maxPrefixLine comes out in prefixed pieces, so that
// the writer holds no more than that; Flush writes a last line without
// its newline.
func TestPrefixWriter(t *testing.T) {
	var out strings.Builder
	var mu sync.Mutex
	p := &prefixWriter{w: &out, mu: &mu, prefix: "[1] "}
	for _, w := range []string{"a", "b\nc\n", "\nd"} {
		if n, err := p.Write([]byte(w)); n != len(w) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", w, n, err)
		}
	}
	if out.String() != "[1] ab\n[1] c\n[1] \n" {
		t.Errorf("before Flush: %q", out.String())
	}
	p.Flush()
	if out.String() != "[1] ab\n[1] c\n[1] \n[1] d\n" {
		t.Errorf("after Flush: %q", out.String())
	}
	out.Reset()
	long := strings.Repeat("x", 2*maxPrefixLine+5)
	_, _ = p.Write([]byte(long))
	if len(p.buf) >= maxPrefixLine {
		t.Errorf("holds %d bytes of one line", len(p.buf))
	}
	p.Flush()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 || strings.Join(lines, "") != strings.Repeat("[1] "+strings.Repeat("x", maxPrefixLine), 2)+"[1] xxxxx" {
		t.Errorf("a long line came out as %d lines", len(lines))
	}
}
