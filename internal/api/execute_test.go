package api

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestExecuteLanguagesAreTheSpecs: POST /v1/execute accepts exactly the
// names and aliases of internal/lang, which api/openapi.yaml's enum lists
// (pkg/client's spec test holds its Language constants to the enum).
func TestExecuteLanguagesAreTheSpecs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string `yaml:"enum"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	got := spec.Components.Schemas["ExecuteRequest"].Properties["language"].Enum
	want := lang.AllNames()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ExecuteRequest.language's enum %v, internal/lang's names %v", got, want)
	}
	for _, n := range want {
		if _, ok := lang.LookupExact(n); !ok {
			t.Errorf("%s not accepted", n)
		}
	}
	for _, n := range []string{"Python", " cpp", "C++", "cobol", ""} {
		if _, ok := lang.LookupExact(n); ok {
			t.Errorf("%q accepted: the enum does not list it", n)
		}
	}
}

// TestExecuteSpec: an interpreted script is written to /tmp and run from
// the template's working directory, as python's and bash's always were; a
// compiled one is compiled (Prepare) and run in /tmp with the table's
// commands and environment; Java's file and class follow its public class.
func TestExecuteSpec(t *testing.T) {
	l := func(n string) lang.Language {
		t.Helper()
		x, ok := lang.LookupExact(n)
		if !ok {
			t.Fatalf("no %s", n)
		}
		return x
	}
	for _, tc := range []struct {
		lang, script, template, path, cwd, prepare, argv string
	}{
		{client.LanguagePython, "print(1)", "python", "/tmp/main.py", "", "", "python3 /tmp/main.py"},
		{client.LanguageBash, "echo", "base", "/tmp/main.sh", "", "", "bash /tmp/main.sh"},
		{client.LanguageJs, "1", "node", "/tmp/main.js", "", "", "node /tmp/main.js"},
		{client.LanguageCPlusPlus, "int main(){}", "polyglot", "main.cpp", "/tmp", "g++ -O2 -std=c++17 -o main main.cpp", "./main"},
		{client.LanguageJava, "public class Sol { }", "polyglot", "Sol.java", "/tmp", "javac -encoding UTF-8 -d . Sol.java",
			"java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss64m -cp . Sol"},
		{client.LanguageTs, "let x = 1", "polyglot", "main.ts", "/tmp", "tsc --target es2020 --module commonjs --typeRoots /usr/local/lib/node_modules/@types --types node --skipLibCheck --noEmitOnError main.ts", "node main.js"},
	} {
		sp := executeSpec(l(tc.lang), tc.script)
		if sp.Template != tc.template || sp.Path != tc.path || sp.Cwd != tc.cwd || strings.Join(sp.Prepare, " ") != tc.prepare ||
			strings.Join(sp.Argv, " ") != tc.argv || sp.Script != tc.script {
			t.Errorf("%s: %+v", tc.lang, sp)
		}
		if (sp.Prepare != nil) != (sp.PrepareTimeout == executeCompileTimeout) {
			t.Errorf("%s: compile timeout %g", tc.lang, sp.PrepareTimeout)
		}
	}
	if sp := executeSpec(l(client.LanguageGo), "package main"); sp.Env["GOCACHE"] == "" || sp.Env["GOTOOLCHAIN"] != "local" {
		t.Errorf("go: env %v", sp.Env)
	}
}

// TestCompileFailure: a compile's result says why the program did not run.
func TestCompileFailure(t *testing.T) {
	for _, tc := range []struct {
		res  client.ExecResult
		want string
	}{
		{client.ExecResult{Status: client.StatusExited, ExitCode: 1}, "compile error: g++ exited 1; the program did not run"},
		{client.ExecResult{Status: client.StatusTimedOut, ExitCode: -1}, "the compile timed out after 30s; the program did not run"},
		{client.ExecResult{Status: client.StatusKilled, Signal: 9, Error: "out-of-memory killer: x"},
			"the compile was killed (signal 9): out-of-memory killer: x; the program did not run"},
	} {
		res := tc.res
		compileFailure(&res, []string{"g++", "main.cpp"}, 30)
		if res.Error != tc.want {
			t.Errorf("%+v: %q, want %q", tc.res, res.Error, tc.want)
		}
	}
}
