package eval

import (
	"strings"
	"testing"
)

func TestCheckers(t *testing.T) {
	for _, c := range []struct {
		kind       string
		abs, rel   float64
		want, got  string
		ok         bool
		detailPart string
	}{
		{CheckTokens, 0, 0, "1 2\n3\n", "1 2 3", true, ""},
		{CheckTokens, 0, 0, "1 2\n3\n", "1   2  \r\n3\r\n\r\n", true, ""}, // trailing spaces, CRLF, blank lines
		{CheckTokens, 0, 0, "", "", true, ""},
		{CheckTokens, 0, 0, "", " \n\r\n", true, ""}, // an empty output is whitespace-only output
		{CheckTokens, 0, 0, "42\n", "", false, "ended after 0 tokens"},
		{CheckTokens, 0, 0, "1 2", "1 2 3", false, "extra \"3\""},
		{CheckTokens, 0, 0, "abc", "ABC", false, "token 1"},
		{CheckTokens, 0, 0, "1.0", "1", false, "token 1"},
		{"", 0, 0, "yes\n", "yes", true, ""}, // the default is tokens
		{CheckExact, 0, 0, "1\n", "1\n", true, ""},
		{CheckExact, 0, 0, "1\n", "1\r\n", false, "byte 1"},
		{CheckExact, 0, 0, "1\n", "1 \n", false, "byte 1"},
		{CheckExact, 0, 0, "", "", true, ""},
		{CheckExact, 0, 0, "", "\n", false, "byte 0"},
		{CheckCaseInsensitive, 0, 0, "YES\nNo", "yes no\r\n", true, ""},
		{CheckCaseInsensitive, 0, 0, "YES", "yess", false, "token 1"},
		{CheckFloat, 0, 0, "0.333333333", "0.3333333", true, ""},
		{CheckFloat, 0, 0, "1e-9", "0", true, ""},              // within the absolute tolerance
		{CheckFloat, 1e-12, -1, "1e-9", "0", false, "token 1"}, // not within a tighter one, no relative
		{CheckFloat, -1, 1e-9, "1e-9", "1.0000000001e-9", true, ""},
		{CheckFloat, -1, 1e-9, "1e-9", "1.1e-9", false, "token 1"},
		{CheckFloat, 0, 0, "1000000", "1000000.5", true, ""}, // relative 1e-6 of 1e6 is 1
		{CheckFloat, 0, 0, "1000000", "1000002", false, "token 1"},
		{CheckFloat, 0, 0, "nan inf -inf", "NaN +Inf -Inf", true, ""},
		{CheckFloat, 0, 0, "inf", "1e308", false, "token 1"},
		{CheckFloat, 0, 0, "YES 1.5", "YES 1.5000001", true, ""}, // words as text, numbers with tolerance
		{CheckFloat, 0, 0, "YES", "yes", false, "token 1"},
		{CheckFloat, 0, 0, "16", "0x10", false, "token 1"}, // hex is not a judge's number
		{CheckFloat, 0, 0, "1", "", false, "ended after 0 tokens"},
	} {
		ch := Checker{Kind: c.kind, AbsTol: c.abs, RelTol: c.rel}
		if err := ch.Validate(); err != nil {
			t.Fatalf("%+v: %v", ch, err)
		}
		d := ch.Compare(c.want, c.got)
		if (d == "") != c.ok || !strings.Contains(d, c.detailPart) {
			t.Errorf("%s(abs %g, rel %g) %q vs %q: %q, want ok=%v with %q", c.kind, c.abs, c.rel, c.want, c.got, d, c.ok, c.detailPart)
		}
	}
}

func TestCheckerValidate(t *testing.T) {
	for _, ch := range []Checker{{Kind: "fuzzy"}, {Kind: CheckFloat, AbsTol: nan()}, {Kind: CheckFloat, RelTol: inf()}} {
		if ch.Validate() == nil {
			t.Errorf("%+v: accepted", ch)
		}
	}
}

// TestCheckerDetailBounded: a huge token is shown clipped.
func TestCheckerDetailBounded(t *testing.T) {
	d := Checker{}.Compare(strings.Repeat("a", 1<<20), "b")
	if len(d) > 300 {
		t.Errorf("detail of %d bytes", len(d))
	}
}

func nan() float64 { var z float64; return z / z }
func inf() float64 { var z float64; return 1 / z }
