package template

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestParseSpec(t *testing.T) {
	spec, err := ParseSpec([]byte(`
from: python
steps:
  - run: pip install numpy
  - env: {A: 1, B: "two", C: true}
  - workdir: /app
  - copy: {src: ./harness, dst: /opt/harness}
  - copy: "data/x.txt x.txt"
  - copy: {src: bin, dst: /usr/local/bin/, owner: "app:staff", mode: "0755"}
  - user: runner
cpu: 1.5
memory_mb: 1024
disk_mb: 2048
start_cmd: python3 -m http.server 8000
ready_cmd: python3 -c 'import numpy'
network: none
`))
	if err != nil {
		t.Fatal(err)
	}
	want := client.TemplateSpec{From: "python", CPU: 1.5, MemoryMB: 1024, DiskMB: 2048, ReadyCmd: "python3 -c 'import numpy'",
		StartCmd: "python3 -m http.server 8000",
		Network:  "none", Steps: []client.TemplateStep{
			{Run: "pip install numpy"},
			{Env: map[string]string{"A": "1", "B": "two", "C": "true"}},
			{Workdir: "/app"},
			{Copy: &client.CopyStep{Src: "./harness", Dst: "/opt/harness"}},
			{Copy: &client.CopyStep{Src: "data/x.txt", Dst: "x.txt"}},
			{Copy: &client.CopyStep{Src: "bin", Dst: "/usr/local/bin/", Owner: "app:staff", Mode: "0755"}},
			{User: "runner"},
		}}
	if got, w := describeSpec(spec), describeSpec(want); got != w {
		t.Errorf("got  %s\nwant %s", got, w)
	}
	if got := CopySources(spec); !slices.Equal(got, []string{"harness", "data/x.txt", "bin"}) {
		t.Errorf("CopySources = %v", got)
	}
	// JSON is YAML.
	if _, err := ParseSpec([]byte(`{"from":"base","steps":[{"run":"true"}]}`)); err != nil {
		t.Errorf("JSON spec: %v", err)
	}
}

func describeSpec(s client.TemplateSpec) string {
	var b strings.Builder
	b.WriteString(s.From + " " + s.StartCmd + " " + s.ReadyCmd + " " + s.Network)
	for _, st := range s.Steps {
		b.WriteString(" | " + StepKind(st) + ":" + st.Run + st.Workdir + st.User)
		for _, k := range sortedKeys(st.Env) {
			b.WriteString(k + "=" + st.Env[k] + ",")
		}
		if st.Copy != nil {
			b.WriteString(st.Copy.Src + ">" + st.Copy.Dst + " " + st.Copy.Owner + " " + st.Copy.Mode)
		}
	}
	return b.String()
}

func TestParseSpecErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"":                                "spec is empty",
		"- a\n- b":                        "spec must be a mapping",
		"from: base\nbogus: 1":            `line 2: unknown field "bogus"`,
		"steps:\n  - run: true":           "from is required",
		"from: ../x":                      `from: "../x" is not a template name`,
		"from: 'snapshot:'":               `from: "snapshot:" names no snapshot`,
		"from: base\nsteps:\n  - frob: x": `step 1 (line 3): unknown step kind "frob" (want one of run, copy, env, workdir, user)`,
		"from: base\nsteps:\n  - run: a\n    env: {A: 1}":                     "step 1 (line 3): a step is a mapping with exactly one key",
		"from: base\nsteps:\n  - run: ''":                                     "step 1: run: the value is empty",
		"from: base\nsteps:\n  - workdir: rel":                                `step 1: workdir "rel" must be an absolute path`,
		"from: base\nsteps:\n  - user: 'a b'":                                 `step 1: user "a b" is not a user name`,
		"from: base\nsteps:\n  - copy: {src: ../x, dst: /x}":                  `step 1: copy: src "../x" is outside the build context`,
		"from: base\nsteps:\n  - copy: {src: /etc, dst: /x}":                  `src "/etc" is an absolute path`,
		"from: base\nsteps:\n  - copy: {src: a}":                              "step 1: copy: dst is required",
		"from: base\nsteps:\n  - copy: {src: a, dst: b, chmod: 1}":            `copy has src, dst, owner and mode, not "chmod"`,
		"from: base\nsteps:\n  - copy: {src: a, dst: b, mode: 1}":             `mode "1" is not octal permission bits`,
		"from: base\nsteps:\n  - copy: {src: a, dst: b, mode: \"0999\"}":      `mode "0999" is not octal`,
		"from: base\nsteps:\n  - copy: {src: a, dst: b, owner: \"a:b:c\"}":    `owner "a:b:c" is not user or user:group`,
		"from: base\nsteps:\n  - copy: {src: a, dst: b, owner: \"Bad Name\"}": `owner "Bad Name" is not user`,
		"from: base\nsteps:\n  - env: {'A=B': x}":                             `env: "A=B" is not a variable name`,
		"from: base\nnetwork: bridge":                                         `network must be "outbound" or "none"`,
		"from: base\ncpu: lots":                                               "line 2: cpu must be a number",
		"from: base\nsteps: {run: x}":                                         "steps must be a list",
		"from: [base]":                                                        "from must be a string",
		"from: base\nsteps:\n  - run: [a, b]":                                 "run must be a string",
		"from: base\nsteps: [":                                                "not valid YAML",
	} {
		_, err := ParseSpec([]byte(spec))
		var se *SpecError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSpec(%q) = %v, want a SpecError with %q", spec, err, want)
		}
	}
}

func TestCheckContext(t *testing.T) {
	dir := t.TempDir()
	mkTreeNoRoot(t, dir, map[string]string{"ok/a": "a", "ok/rel": "->a", "out/abs": "->/etc/passwd", "up/esc": "->../../x",
		"via": "->ok", "file": "f"})
	spec := func(src string) client.TemplateSpec {
		return client.TemplateSpec{From: "base", Steps: []client.TemplateStep{{Copy: &client.CopyStep{Src: src, Dst: "/x"}}}}
	}
	for src, want := range map[string]string{
		"ok": "", "file": "", ".": "symlink to the absolute path", "ok/rel": "",
		"out":     "symlink to the absolute path /etc/passwd, outside the build context",
		"up":      "symlink to ../../x, outside the build context",
		"via/a":   "via is a symlink: sources are not reached through symlinks",
		"missing": "not found in the build context",
	} {
		err := CheckContext(spec(src), dir)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("copy %s: %v, want %q", src, err, want)
		}
	}
	if err := CheckContext(spec("ok"), ""); err == nil || !strings.Contains(err.Error(), "no build context was sent") {
		t.Errorf("no context: %v", err)
	}
}

// mkTreeNoRoot is mkTree without what needs root.
func mkTreeNoRoot(t *testing.T, dir string, spec map[string]string) {
	t.Helper()
	for k, v := range spec {
		p := filepath.Join(dir, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if strings.HasPrefix(v, "->") {
			err = os.Symlink(strings.TrimPrefix(v, "->"), p)
		} else {
			err = os.WriteFile(p, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestHashSource(t *testing.T) {
	dir := t.TempDir()
	mkTreeNoRoot(t, dir, map[string]string{"d/a": "alpha", "d/sub/b": "beta", "d/l": "->a"})
	h1, err := hashSource(dir, "d")
	if err != nil {
		t.Fatal(err)
	}
	// Times do not count (the copy does not keep them as inputs).
	old := time.Unix(1000, 0)
	if err := os.Chtimes(filepath.Join(dir, "d/a"), old, old); err != nil {
		t.Fatal(err)
	}
	if h, _ := hashSource(dir, "d"); h != h1 {
		t.Error("an mtime changed the hash")
	}
	for name, change := range map[string]func() error{
		"content": func() error { return os.WriteFile(filepath.Join(dir, "d/sub/b"), []byte("BETA"), 0o644) },
		"mode":    func() error { return os.Chmod(filepath.Join(dir, "d/a"), 0o755) },
		"link": func() error {
			os.Remove(filepath.Join(dir, "d/l"))
			return os.Symlink("sub/b", filepath.Join(dir, "d/l"))
		},
		"new": func() error { return os.WriteFile(filepath.Join(dir, "d/new"), nil, 0o644) },
	} {
		before, _ := hashSource(dir, "d")
		if err := change(); err != nil {
			t.Fatal(err)
		}
		if after, _ := hashSource(dir, "d"); after == before {
			t.Errorf("a %s change kept the hash", name)
		}
	}
}
