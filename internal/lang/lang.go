// Package lang is the one table of the languages evalbox is to compile
// and run for stdin/stdout judging (issue 15): their names (SandboxFusion's
// where it has one) and the aliases people type, the template with their
// toolchain, the file a program is written to, how it is compiled (a phase
// of its own, whose product every test of a sample reuses) and how it is
// run. POST /v1/execute and SandboxFusion's /run_code run programs by it;
// docs/languages.md shows it (Markdown, held equal by a test).
//
// To add a language: a row here (its toolchain in the polyglot template's
// packages, internal/template, or a template of its own), its hello world
// in test/e2e/languages_test.go, the docs' table regenerated (go test
// ./internal/lang -run TestDocs -update), and its names in api/openapi.yaml's
// ExecuteRequest.language enum and pkg/client's Language constants.
package lang

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Language is how one language's programs are compiled and run in a
// sandbox. Paths are relative to the program's directory (the run's
// working directory), which the program's user may write to.
type Language struct {
	// Name is the canonical name, as requests and results give it.
	Name string
	// Aliases are other names a request may use.
	Aliases []string
	// Template is the built-in template with the language's toolchain.
	Template string
	// File is the name the source is written to (see SourceFile).
	File string
	// Compile is the compile command (nil: none, the source runs as it
	// is), with Flags standing in for the "{flags}" element and the
	// source file name for "{file}".
	Compile []string
	// Flags are the compiler flags a request may replace (compile_flags).
	Flags []string
	// Run is the command that runs the program (after Compile); "{file}"
	// is the source file, "{class}" Java's main class.
	Run []string
	// Env is set for both commands.
	Env map[string]string
	// Version is the toolchain, as the template's Debian packages give it.
	Version string
	// MemoryOverheadMB is resident memory of the language's runtime that a
	// memory limit does not count (the JVM's own, which under gVisor is
	// above 128 MiB before main runs): the limit bounds the program's
	// heap ("{memory}" in Run) and the sampled memory may pass it by this
	// much.
	MemoryOverheadMB int
	// OOMMarker, in the stderr of a run that failed, says the runtime ran
	// out of its heap (bounded by "{memory}"): a memory limit exceeded,
	// not a runtime error.
	OOMMarker string
}

// Templates of the languages: python, node and base are the other
// built-ins, polyglot has every toolchain.
const (
	TemplatePolyglot = "polyglot"
)

// table lists every language, in the order the docs show them.
var table = []Language{
	{Name: "python", Aliases: []string{"python3", "py"}, Template: "python", File: "main.py",
		Run: []string{"python3", "{file}"}, Version: "CPython 3.11.2 (Debian 12)"},
	{Name: "c", Template: TemplatePolyglot, File: "main.c",
		Compile: []string{"gcc", "{flags}", "-o", "main", "{file}", "-lm"}, Flags: []string{"-O2", "-std=gnu17"},
		Run: []string{"./main"}, Version: "GCC 12.2.0 (Debian 12)"},
	{Name: "cpp", Aliases: []string{"c++", "cxx", "cc"}, Template: TemplatePolyglot, File: "main.cpp",
		Compile: []string{"g++", "{flags}", "-o", "main", "{file}"}, Flags: []string{"-O2", "-std=c++17"},
		Run: []string{"./main"}, Version: "GCC 12.2.0 (Debian 12)"},
	{Name: "java", Template: TemplatePolyglot, File: "Main.java",
		Compile: []string{"javac", "{flags}", "-d", ".", "{file}"}, Flags: []string{"-encoding", "UTF-8"},
		Run:              []string{"java", "-Xmx{memory}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss64m", "-cp", ".", "{class}"},
		MemoryOverheadMB: 256, OOMMarker: "java.lang.OutOfMemoryError",
		Version: "OpenJDK 17.0.19 (Debian 12)"},
	// Node.js alone is in the node template too (the same Debian package):
	// the lighter one, as SandboxFusion's nodejs always ran there.
	{Name: "nodejs", Aliases: []string{"javascript", "js", "node"}, Template: "node", File: "main.js",
		Run: []string{"node", "{file}"}, Version: "Node.js 18.20.4 (Debian 12)"},
	// --skipLibCheck: the declarations of Node.js's and the standard
	// library's types are not checked again on every compile (the
	// program still is): 6.4 s → 2.0 s for a hello world on namespaces,
	// 8.8 s → 3.4 s on gVisor.
	{Name: "typescript", Aliases: []string{"ts"}, Template: TemplatePolyglot, File: "main.ts",
		Compile: []string{"tsc", "{flags}", "{file}"}, Flags: []string{"--target", "es2020", "--module", "commonjs", "--typeRoots", "/usr/local/lib/node_modules/@types", "--types", "node", "--skipLibCheck", "--noEmitOnError"},
		Run: []string{"node", "main.js"}, Version: "TypeScript 5.6.3 (npm), on Node.js 18.20.4"},
	{Name: "go", Aliases: []string{"golang"}, Template: TemplatePolyglot, File: "main.go",
		Compile: []string{"go", "build", "{flags}", "-o", "main", "{file}"}, Flags: []string{},
		Run: []string{"./main"}, Env: map[string]string{"GOCACHE": "/tmp/.gocache", "GOPATH": "/tmp/.gopath", "GO111MODULE": "off", "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"},
		Version: "Go 1.19.8 (Debian 12)"},
	{Name: "rust", Aliases: []string{"rs"}, Template: TemplatePolyglot, File: "main.rs",
		Compile: []string{"rustc", "{flags}", "-o", "main", "{file}"}, Flags: []string{"-O", "--edition", "2021"},
		Run: []string{"./main"}, Version: "rustc 1.63.0 (Debian 12)"},
	{Name: "bash", Aliases: []string{"sh", "shell"}, Template: "base", File: "main.sh",
		Run: []string{"bash", "{file}"}, Version: "bash 5.2.15 (Debian 12)"},
}

var byName = func() map[string]*Language {
	m := map[string]*Language{}
	for i := range table {
		l := &table[i]
		for _, n := range append([]string{l.Name}, l.Aliases...) {
			if _, dup := m[n]; dup {
				panic("lang: " + n + " named twice")
			}
			m[n] = l
		}
	}
	return m
}()

// All returns every language, in the table's order.
func All() []Language { return slices.Clone(table) }

// Names returns the canonical names, in the table's order.
func Names() []string {
	out := make([]string, len(table))
	for i, l := range table {
		out[i] = l.Name
	}
	return out
}

// Lookup returns the language named name or one of its aliases (case
// insensitive).
func Lookup(name string) (Language, bool) {
	l, ok := byName[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Language{}, false
	}
	return *l, true
}

// LookupExact returns the language named name or one of its aliases,
// spelt exactly as the table spells it (lower case, no spaces): what an
// API whose schema lists the names (an enum) accepts.
func LookupExact(name string) (Language, bool) {
	l, ok := byName[name]
	if !ok {
		return Language{}, false
	}
	return *l, true
}

// AllNames returns every name a language is known by: each canonical name
// followed by its aliases, in the table's order.
func AllNames() []string {
	var out []string
	for _, l := range table {
		out = append(out, l.Name)
		out = append(out, l.Aliases...)
	}
	return out
}

// Resolve is Lookup with an error that lists what is known.
func Resolve(name string) (Language, error) {
	l, ok := Lookup(name)
	if !ok {
		return Language{}, fmt.Errorf("unknown language %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return l, nil
}

// Compiled reports whether the language has a compile phase.
func (l Language) Compiled() bool { return l.Compile != nil }

// MaxFlags bounds a request's compile flags.
const MaxFlags = 64

// CheckFlags checks compile flags a request gives: a bounded number of
// non-empty arguments without NUL bytes, none of which names the output
// (the program must be where Run finds it).
func CheckFlags(flags []string) error {
	if len(flags) > MaxFlags {
		return fmt.Errorf("at most %d compile flags, got %d", MaxFlags, len(flags))
	}
	for _, f := range flags {
		switch {
		case f == "" || strings.IndexByte(f, 0) >= 0 || len(f) > 1024:
			return fmt.Errorf("compile flag %q: empty, too long or with a NUL byte", f)
		case strings.HasPrefix(f, "-o"), f == "-d", f == "--out-dir", f == "--outDir", f == "--outFile":
			return fmt.Errorf("compile flag %q: the output's place is evalbox's", f)
		}
	}
	return nil
}

// CompileArgv is the compile command of a program in file, with flags (nil:
// the language's own).
func (l Language) CompileArgv(file string, flags []string) []string {
	if l.Compile == nil {
		return nil
	}
	if flags == nil {
		flags = l.Flags
	}
	var out []string
	for _, a := range l.Compile {
		switch a {
		case "{flags}":
			out = append(out, flags...)
		case "{file}":
			out = append(out, file)
		default:
			out = append(out, a)
		}
	}
	return out
}

// RunArgv is the command that runs a program whose source is file and
// (Java) whose main class is class, with no memory limit of its own.
func (l Language) RunArgv(file, class string) []string {
	return l.RunArgvLimited(file, class, 0)
}

// RunArgvLimited is RunArgv for a run whose memory limit is memoryMB (0:
// none): a runtime with a heap bound of its own ("{memory}") gets it.
func (l Language) RunArgvLimited(file, class string, memoryMB int) []string {
	out := make([]string, 0, len(l.Run))
	for _, a := range l.Run {
		switch {
		case a == "{file}":
			out = append(out, file)
		case a == "{class}":
			out = append(out, class)
		case strings.Contains(a, "{memory}"):
			if memoryMB > 0 {
				out = append(out, strings.ReplaceAll(a, "{memory}", strconv.Itoa(memoryMB)))
			}
		default:
			out = append(out, a)
		}
	}
	return out
}

// EnvList is Env as sorted KEY=VALUE.
func (l Language) EnvList() []string {
	var out []string
	for k, v := range l.Env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// javaPublicClass finds the public type of a Java source's top level (see
// javaTopLevel): the one whose file name javac requires.
var javaPublicClass = regexp.MustCompile(`(?:^|[^A-Za-z0-9_$])public\s+(?:(?:final|abstract|strictfp|sealed|non-sealed)\s+)*(?:class|record|enum|interface)\s+([A-Za-z_$][A-Za-z0-9_$]*)`)

// javaClass finds the first top-level class when no type is public.
var javaClass = regexp.MustCompile(`(?:^|[^A-Za-z0-9_$])(?:class|record|enum)\s+([A-Za-z_$][A-Za-z0-9_$]*)`)

// javaTopLevel is source with what is not at its top level blanked out:
// comments, string and character literals, and everything between braces
// (the members, and the types nested in them). A public inner class is
// then not taken for the file's.
func javaTopLevel(source string) string {
	out := []byte(source)
	depth := 0
	for i := 0; i < len(out); i++ {
		start := i
		switch {
		case strings.HasPrefix(source[i:], "//"):
			for i < len(out) && out[i] != '\n' {
				i++
			}
		case strings.HasPrefix(source[i:], "/*"):
			end := strings.Index(source[i+2:], "*/")
			i = len(out) - 1
			if end >= 0 {
				i = start + 2 + end + 1
			}
		case strings.HasPrefix(source[i:], `"""`):
			end := strings.Index(source[i+3:], `"""`)
			i = len(out) - 1
			if end >= 0 {
				i = start + 3 + end + 2
			}
		case out[i] == '"' || out[i] == '\'':
			q := out[i]
			for i++; i < len(out) && out[i] != q && out[i] != '\n'; i++ {
				if out[i] == '\\' {
					i++
				}
			}
		case out[i] == '{':
			depth++
			out[i] = ' '
			continue
		case out[i] == '}':
			depth = max(0, depth-1)
			out[i] = ' '
			continue
		default:
			if depth > 0 && out[i] != '\n' {
				out[i] = ' '
			}
			continue
		}
		for j := start; j <= i && j < len(out); j++ {
			if out[j] != '\n' {
				out[j] = ' '
			}
		}
	}
	return string(out)
}

// SourceFile returns the file name source is written to and, for Java,
// the main class: the public class's name (javac requires the file to
// carry it), else the first top-level class, else Main.
func (l Language) SourceFile(source string) (file, class string) {
	if l.Name != "java" {
		return l.File, ""
	}
	top := javaTopLevel(source)
	if m := javaPublicClass.FindStringSubmatch(top); m != nil {
		return m[1] + ".java", m[1]
	}
	if m := javaClass.FindStringSubmatch(top); m != nil {
		return "Main.java", m[1]
	}
	return "Main.java", "Main"
}

// Markdown renders the table, for the languages document.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| language | aliases | template | file | compile (default flags) | run | toolchain |\n|---|---|---|---|---|---|---|\n")
	for _, l := range table {
		compile := "—"
		if l.Compiled() {
			compile = "`" + strings.Join(l.CompileArgv(l.File, nil), " ") + "`"
		}
		aliases := "—"
		if len(l.Aliases) > 0 {
			aliases = "`" + strings.Join(l.Aliases, "`, `") + "`"
		}
		_, class := l.SourceFile("")
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | `%s` | %s | `%s` | %s |\n", l.Name, aliases, l.Template, l.File, compile,
			strings.Join(l.RunArgv(l.File, class), " "), l.Version)
	}
	return b.String()
}

// Python is the language of HumanEval-style problems, the default.
var Python = mustLookup("python")

func mustLookup(name string) Language {
	l, ok := Lookup(name)
	if !ok {
		panic("lang: no " + name)
	}
	return l
}
