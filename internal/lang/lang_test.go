package lang

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/template"
)

func TestLookup(t *testing.T) {
	for name, want := range map[string]string{
		"python": "python", "PY": "python", "cpp": "cpp", "c++": "cpp", "C++ ": "cpp", "c": "c", "java": "java",
		"javascript": "nodejs", "js": "nodejs", "nodejs": "nodejs", "ts": "typescript", "typescript": "typescript",
		"go": "go", "golang": "go", "rust": "rust", "bash": "bash", "sh": "bash",
	} {
		l, ok := Lookup(name)
		if !ok || l.Name != want {
			t.Errorf("Lookup(%q) = %q, %v; want %q", name, l.Name, ok, want)
		}
	}
	// The exact spellings only, as an enum lists them.
	for _, n := range AllNames() {
		if l, ok := LookupExact(n); !ok || (l.Name != n && !slices.Contains(l.Aliases, n)) {
			t.Errorf("LookupExact(%q) = %q, %v", n, l.Name, ok)
		}
	}
	for _, n := range []string{"PY", "C++ ", ""} {
		if _, ok := LookupExact(n); ok {
			t.Errorf("LookupExact(%q) found it", n)
		}
	}
	if _, err := Resolve("cobol"); err == nil || !strings.Contains(err.Error(), "cpp") {
		t.Errorf("Resolve(cobol): %v", err)
	}
	// SandboxFusion's names, where it has them, are canonical here.
	for _, n := range []string{"python", "cpp", "java", "go", "rust", "nodejs", "typescript", "bash"} {
		if !slices.Contains(Names(), n) {
			t.Errorf("%s is not a canonical name", n)
		}
	}
}

func TestCommands(t *testing.T) {
	cpp, _ := Lookup("cpp")
	if got := strings.Join(cpp.CompileArgv("main.cpp", nil), " "); got != "g++ -O2 -std=c++17 -o main main.cpp" {
		t.Errorf("cpp compile: %s", got)
	}
	if got := strings.Join(cpp.CompileArgv("main.cpp", []string{"-O0", "-std=c++20"}), " "); got != "g++ -O0 -std=c++20 -o main main.cpp" {
		t.Errorf("cpp compile with flags: %s", got)
	}
	py, _ := Lookup("python")
	if py.Compiled() || py.CompileArgv("main.py", nil) != nil || strings.Join(py.RunArgv("main.py", ""), " ") != "python3 main.py" {
		t.Errorf("python: %+v", py)
	}
	java, _ := Lookup("java")
	for src, want := range map[string][2]string{
		"public class Solution {\n  public static void main(String[] a) {}\n}": {"Solution.java", "Solution"},
		"import java.util.*;\nfinal public class A {}":                         {"A.java", "A"},
		"class Main2 { public static void main(String[] a) {} }":               {"Main.java", "Main2"},
		"// nothing": {"Main.java", "Main"},
		// A public inner class is not the file's, nor a class in a
		// comment or a string.
		"class Main {\n  public class Node {}\n  public static void main(String[] a) {}\n}":                             {"Main.java", "Main"},
		"// public class Fake {}\n/* public class Fake2 {} */\npublic class Real { String s = \"public class S {}\"; }": {"Real.java", "Real"},
		"public record Point(int x, int y) { public static void main(String[] a) {} }":                                  {"Point.java", "Point"},
		"import java.util.*;\npublic final class Sol { static class Inner {} }":                                         {"Sol.java", "Sol"},
		"public class A { char c = '{'; String t = \"}\"; }\nclass B {}":                                                {"A.java", "A"},
	} {
		file, class := java.SourceFile(src)
		if file != want[0] || class != want[1] {
			t.Errorf("java %q: %s %s, want %v", src, file, class, want)
		}
		if run := java.RunArgv(file, class); run[len(run)-1] != class {
			t.Errorf("java run: %v", run)
		}
	}
}

// TestTemplatesAreBuiltins: every language's toolchain is in a built-in.
func TestTemplatesAreBuiltins(t *testing.T) {
	for _, l := range All() {
		if !template.IsBuiltin(l.Template) {
			t.Errorf("%s: template %q is not a built-in", l.Name, l.Template)
		}
	}
}

func TestCheckFlags(t *testing.T) {
	if err := CheckFlags([]string{"-O3", "-std=c++20", "-DLOCAL", "-fno-exceptions"}); err != nil {
		t.Error(err)
	}
	for _, bad := range [][]string{{"-o", "x"}, {"-ox"}, {"-d", "/tmp"}, {"--outDir", "x"}, {""}, {"a\x00b"}, make([]string, MaxFlags+1)} {
		if CheckFlags(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestMarkdownHasEveryLanguage(t *testing.T) {
	md := Markdown()
	for _, l := range All() {
		if !strings.Contains(md, "| `"+l.Name+"` |") {
			t.Errorf("%s not in the table", l.Name)
		}
	}
}

// update rewrites docs/languages.md's table from the code (go test
// ./internal/lang -run TestDocs -update).
var update = flag.Bool("update", false, "rewrite docs/languages.md's table from Markdown()")

// Markers around the generated table in docs/languages.md.
const (
	docsPath  = "../../docs/languages.md"
	docsBegin = "<!-- BEGIN lang.Markdown(): generated, go test ./internal/lang -run TestDocs -update -->\n"
	docsEnd   = "<!-- END lang.Markdown() -->\n"
)

// TestDocs: docs/languages.md's table is Markdown()'s, between its markers.
func TestDocs(t *testing.T) {
	b, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	before, rest, ok := strings.Cut(doc, docsBegin)
	table, after, ok2 := strings.Cut(rest, docsEnd)
	if !ok || !ok2 {
		t.Fatalf("%s: no %q … %q markers", docsPath, docsBegin, docsEnd)
	}
	if table == Markdown() {
		return
	}
	if *update {
		if err := os.WriteFile(docsPath, []byte(before+docsBegin+Markdown()+docsEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's table is not lang.Markdown()'s: run go test ./internal/lang -run TestDocs -update\n--- docs\n%s--- Markdown()\n%s", docsPath, table, Markdown())
}
