package eval

// MultiPL-E records.

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// multiPLELangs maps MultiPL-E's language codes onto internal/lang names.
var multiPLELangs = map[string]string{
	"py": "python", "python": "python", "notypes.py": "python",
	"cpp":  "cpp",
	"java": "java",
	"js":   "nodejs", "javascript": "nodejs",
	"ts": "typescript", "typescript": "typescript",
	"rs": "rust", "rust": "rust",
	"sh": "bash", "bash": "bash",
}

// MultiPLELanguages lists the MultiPL-E language codes ReadProblemsFormat
// takes.
func MultiPLELanguages() []string {
	var out []string
	for k := range multiPLELangs {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

var (
	// javaAssert is one of MultiPL-E's Java checks, one a line: assert
	// runs only with java -ea, which the judge does not pass.
	javaAssert = regexp.MustCompile(`(?m)^([ \t]*)assert[ \t]*\((.*)\);[ \t]*$`)
	// javaTuples are the classes of org.javatuples.
	javaTuples = regexp.MustCompile(`\b(Pair|Triplet|Quartet|Quintet|Sextet|Septet|Octet|Ennead|Decade|Unit|KeyValue|LabelValue)\b`)
	// javaTuplesImport is the import every MultiPL-E Java prompt has.
	javaTuplesImport = regexp.MustCompile(`(?m)^import org\.javatuples\.\*;[ \t]*\n`)
)

// multiPLEProblem: assert mode in the problem's language: prompt,
// completion and tests are one program that passes when it exits 0.
func multiPLEProblem(f fields, rec record) (Problem, error) {
	id, err := f.taskID(rec, "name", "task_id")
	if err != nil {
		return Problem{}, err
	}
	p := Problem{TaskID: id}
	code, err := f.str("language")
	if err != nil {
		return p, err
	}
	name, ok := multiPLELangs[strings.ToLower(code)]
	switch {
	case code == "":
		return p, errors.New("no language")
	case strings.HasPrefix(code, "go"):
		return p, fmt.Errorf("language %q: MultiPL-E's Go tests are `go test` files (a _test package, func Test…(t *testing.T)); evalbox runs Go programs with go build: not supported", code)
	case !ok:
		return p, fmt.Errorf("language %q is not supported (supported: %s)", code, strings.Join(MultiPLELanguages(), ", "))
	}
	p.Language = name
	if p.Prompt, err = f.str("prompt"); err != nil {
		return p, err
	}
	if p.Test, err = f.str("tests"); err != nil {
		return p, err
	}
	if strings.TrimSpace(p.Test) == "" {
		return p, errors.New("no tests")
	}
	if name == "java" {
		// MultiPL-E runs java -ea; the judge runs without: the checks
		// become plain code. The polyglot template has no javatuples jar:
		// the import goes where no class of it is used.
		p.Test = javaAssert.ReplaceAllString(p.Test, "${1}if (!(${2})) throw new AssertionError();")
		if !javaTuples.MatchString(p.Prompt + p.Test) {
			p.Prompt = javaTuplesImport.ReplaceAllString(p.Prompt, "")
		}
	}
	return p, nil
}
