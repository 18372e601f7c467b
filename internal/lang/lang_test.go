package lang

import (
	"slices"
	"strings"
	"testing"
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
