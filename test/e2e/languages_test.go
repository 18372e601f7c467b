package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/pkg/client"
)

// helloWorlds are each language's hello world (internal/lang's table, by
// canonical name): it prints "hello from NAME" and reads something of its
// toolchain (a type check, a standard library), so that the compile does
// real work.
var helloWorlds = map[string]string{
	"python": "import sys\nprint('hello from python', file=sys.stdout)\n",
	"c":      "#include <math.h>\n#include <stdio.h>\nint main(void) { printf(\"hello from c %.0f\\n\", sqrt(4.0)); return 0; }\n",
	"cpp": "#include <iostream>\n#include <vector>\nint main() { std::vector<int> v{1, 2}; " +
		"std::cout << \"hello from cpp \" << v.size() << std::endl; }\n",
	"java": "import java.util.List;\npublic class Hello {\n  public static void main(String[] args) {\n" +
		"    System.out.println(\"hello from java \" + List.of(1, 2).size());\n  }\n}\n",
	"nodejs":     "console.log('hello from nodejs', [1, 2].length);\n",
	"typescript": "const n: number = [1, 2].length;\nconsole.log(`hello from typescript ${n}`, typeof process.version);\n",
	"go":         "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from go\", len([]int{1, 2})) }\n",
	"rust":       "fn main() { let v = vec![1, 2]; println!(\"hello from rust {}\", v.len()); }\n",
	"bash":       "a=(1 2)\necho \"hello from bash ${#a[@]}\"\n",
}

// helloOutputs are what they print.
var helloOutputs = map[string]string{
	"python": "hello from python\n", "c": "hello from c 2\n", "cpp": "hello from cpp 2\n", "java": "hello from java 2\n",
	"nodejs": "hello from nodejs 2\n", "typescript": "hello from typescript 2 string\n", "go": "hello from go 2\n",
	"rust": "hello from rust 2\n", "bash": "hello from bash 2\n",
}

// needLanguageTemplates skips the test when a template of the language
// table is not built in EVALBOX_TEMPLATES_DIR (scripts/test.sh builds every
// built-in, polyglot among them, so CI never skips).
func needLanguageTemplates(t *testing.T) {
	t.Helper()
	var missing []string
	for _, l := range lang.All() {
		if _, err := os.Stat(filepath.Join(templatesDir, l.Template, "template.json")); err != nil && !slices.Contains(missing, l.Template) {
			missing = append(missing, l.Template)
		}
	}
	if len(missing) > 0 {
		t.Skipf("templates %s are not built in %s (evalbox template init --templates-dir %s %s)",
			strings.Join(missing, ", "), templatesDir, templatesDir, strings.Join(missing, " "))
	}
}

// TestLanguages: POST /v1/execute runs each language's hello world, as the
// table compiles and runs it, on both runtimes; a compiled one's compile
// and run take one sandbox, which is gone afterwards.
func TestLanguages(t *testing.T) {
	needLanguageTemplates(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
			for _, l := range lang.All() {
				src, ok := helloWorlds[l.Name]
				if !ok {
					t.Errorf("%s: no hello world in helloWorlds", l.Name)
					continue
				}
				start := time.Now()
				res, err := c.Execute(ctxT(t, 3*time.Minute), client.ExecuteRequest{Scripts: []string{src}, Language: l.Name, Runtime: rt})
				if err != nil {
					t.Errorf("%s: %v", l.Name, err)
					continue
				}
				r := res.Results[0]
				if r.Status != client.StatusExited || r.ExitCode != 0 || r.Stdout != helloOutputs[l.Name] || r.Error != "" {
					t.Errorf("%s: %+v, want stdout %q", l.Name, r, helloOutputs[l.Name])
				}
				t.Logf("%-10s %s: %4d ms in all (the program's run %d ms)", l.Name, rt, time.Since(start).Milliseconds(), r.DurationMs)
			}
			// An alias runs its language; a script's public class names
			// Java's file.
			res, err := c.Execute(ctxT(t, 3*time.Minute), client.ExecuteRequest{
				Scripts: []string{helloWorlds["cpp"], "int main() { return 3; }\n"}, Language: client.LanguageCPlusPlus, Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			if r := res.Results; r[0].Stdout != helloOutputs["cpp"] || r[1].Status != client.StatusExited || r[1].ExitCode != 3 || r[1].Error != "" {
				t.Errorf("c++: %+v", r)
			}
			assertNoSandboxes(t, c)
		})
	}
}

// TestLanguagesCompileError: a C++ script that does not compile comes back
// as the compiler's result (exit code 1, its diagnostics on stderr) with
// an error saying the program did not run, not as a failed request; the
// other scripts of the request run.
func TestLanguagesCompileError(t *testing.T) {
	needLanguageTemplates(t)
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
	bad := "#include <cstdio>\nint main() { std::puts(\"never\"); return undeclared; }\n"
	for _, rt := range runtimes {
		res, err := c.Execute(ctxT(t, 3*time.Minute), client.ExecuteRequest{Scripts: []string{bad, helloWorlds["cpp"]}, Language: client.LanguageCpp, Runtime: rt})
		if err != nil {
			t.Fatalf("%s: %v", rt, err)
		}
		r := res.Results[0]
		if r.Status != client.StatusExited || r.ExitCode != 1 || r.Stdout != "" || !strings.Contains(r.Stderr, "undeclared") ||
			!strings.Contains(r.Stderr, "error") || r.Error != "compile error: g++ exited 1; the program did not run" {
			t.Errorf("%s: %+v, want the compile's failure", rt, r)
		}
		if r := res.Results[1]; r.ExitCode != 0 || r.Stdout != helloOutputs["cpp"] {
			t.Errorf("%s: the next script: %+v", rt, r)
		}
	}
	assertNoSandboxes(t, c)
}
