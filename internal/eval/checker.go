package eval

import (
	"fmt"
	"github.com/evalbox/evalbox/internal/lang"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Checker kinds: how a test's output is compared with the expected one,
// outside the sandbox. Tokens is the default, as judges have it.
const (
	// CheckExact: byte for byte.
	CheckExact = "exact"
	// CheckTokens: the whitespace-separated tokens, equal one by one;
	// spaces, tabs, line ends (LF, CRLF, CR) and blank lines do not count.
	CheckTokens = "tokens"
	// CheckFloat: tokens, where two tokens that both read as numbers are
	// equal within AbsTol or RelTol (the larger), others as text.
	CheckFloat = "float"
	// CheckCaseInsensitive: tokens, compared without case.
	CheckCaseInsensitive = "case_insensitive"
	// CheckProgram: a checker program judges (testlib's convention: it
	// gets the input, the output and the expected output; exit 0 accepts).
	CheckProgram = "program"
)

// Default tolerances of CheckFloat.
const (
	DefaultAbsTol = 1e-6
	DefaultRelTol = 1e-6
)

// Checker compares one test's output with its expected output.
type Checker struct {
	Kind string `json:"type,omitempty"`
	// AbsTol, RelTol are CheckFloat's tolerances (0: the defaults; a
	// negative one is not used).
	AbsTol float64 `json:"abs_tol,omitempty"`
	RelTol float64 `json:"rel_tol,omitempty"`
	// Language and Source are CheckProgram's checker: a program in
	// Language ("": python), run by the judge in a sandbox of its own.
	Language string `json:"language,omitempty"`
	Source   string `json:"source,omitempty"`
}

// CheckKinds lists the kinds a Checker compares itself (CheckProgram is
// run by the judge).
var CheckKinds = []string{CheckTokens, CheckExact, CheckFloat, CheckCaseInsensitive}

// Validate reports a kind or tolerance the checker cannot use.
func (c Checker) Validate() error {
	switch c.Kind {
	case "", CheckTokens, CheckExact, CheckFloat, CheckCaseInsensitive, CheckProgram:
	default:
		return fmt.Errorf("checker %q: want one of %s or %s", c.Kind, strings.Join(CheckKinds, ", "), CheckProgram)
	}
	if math.IsNaN(c.AbsTol) || math.IsNaN(c.RelTol) || math.IsInf(c.AbsTol, 0) || math.IsInf(c.RelTol, 0) {
		return fmt.Errorf("checker tolerances must be finite numbers")
	}
	switch {
	case c.Kind == CheckProgram && strings.TrimSpace(c.Source) == "":
		return fmt.Errorf("checker %q needs source, the checker program", CheckProgram)
	case c.Kind != CheckProgram && (c.Source != "" || c.Language != ""):
		return fmt.Errorf("checker source and language are only for type %q", CheckProgram)
	case c.Language != "":
		if _, err := lang.Resolve(c.Language); err != nil {
			return fmt.Errorf("checker: %w", err)
		}
	}
	return nil
}

// Compare compares got (what the program printed) with want. It returns
// "" when they are equal, else where they differ.
func (c Checker) Compare(want, got string) string {
	switch c.Kind {
	case CheckExact:
		if want == got {
			return ""
		}
		i := 0
		for i < len(want) && i < len(got) && want[i] == got[i] {
			i++
		}
		return fmt.Sprintf("byte %d differs: expected %s, got %s", i, quoteOut(want[i:]), quoteOut(got[i:]))
	case CheckFloat, CheckCaseInsensitive, CheckTokens, "":
	default:
		return fmt.Sprintf("checker %q cannot compare", c.Kind)
	}
	// Token by token, without a slice of them: an output of millions of
	// one-byte tokens costs no more memory than its bytes.
	var wi, gi, n int
	for {
		w, wnext := nextToken(want, wi)
		g, gnext := nextToken(got, gi)
		switch {
		case w == "" && g == "":
			return ""
		case g == "":
			return fmt.Sprintf("output ended after %d tokens, expected %d (next %s)", n, n+countTokens(want, wi), quoteOut(w))
		case w == "":
			return fmt.Sprintf("output has %d tokens, expected %d (extra %s)", n+countTokens(got, gi), n, quoteOut(g))
		case !c.tokenEqual(w, g):
			return fmt.Sprintf("token %d differs: expected %s, got %s", n+1, quoteOut(w), quoteOut(g))
		}
		wi, gi, n = wnext, gnext, n+1
	}
}

// nextToken returns the whitespace-separated token of s at or after i
// ("" at the end) and the index after it, with strings.Fields's notion of
// space.
func nextToken(s string, i int) (string, int) {
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += size
	}
	start := i
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			break
		}
		i += size
	}
	return s[start:i], i
}

// countTokens counts the tokens of s from i.
func countTokens(s string, i int) int {
	n := 0
	for {
		var t string
		if t, i = nextToken(s, i); t == "" {
			return n
		}
		n++
	}
}

func (c Checker) tokenEqual(want, got string) bool {
	switch c.Kind {
	case CheckCaseInsensitive:
		return strings.EqualFold(want, got)
	case CheckFloat:
		if want == got {
			return true
		}
		w, err1 := parseNumber(want)
		g, err2 := parseNumber(got)
		if err1 != nil || err2 != nil {
			return false
		}
		if math.IsNaN(w) || math.IsNaN(g) {
			return math.IsNaN(w) && math.IsNaN(g)
		}
		if math.IsInf(w, 0) || math.IsInf(g, 0) {
			return w == g
		}
		abs, rel := c.AbsTol, c.RelTol
		if abs == 0 {
			abs = DefaultAbsTol
		}
		if rel == 0 {
			rel = DefaultRelTol
		}
		d := math.Abs(w - g)
		return (abs > 0 && d <= abs) || (rel > 0 && d <= rel*math.Abs(w))
	}
	return want == got
}

// parseNumber reads a decimal number token (no hex, no underscores, which
// strconv would take but a judge does not print).
func parseNumber(s string) (float64, error) {
	if strings.ContainsAny(s, "_xXpP") {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseFloat(s, 64)
}

// quoteOut shows a piece of output in a detail: quoted, at most about 60
// bytes.
func quoteOut(s string) string {
	return strconv.Quote(clip(s, 60))
}
