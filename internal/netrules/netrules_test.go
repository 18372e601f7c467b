package netrules

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestParseEntry(t *testing.T) {
	for _, c := range []struct {
		in, kind, want string
	}{
		{"10.0.0.0/8", KindCIDR, "10.0.0.0/8"},
		{"203.0.113.7/32", KindCIDR, "203.0.113.7/32"},
		{"2001:db8::/32", KindCIDR, "2001:db8::/32"},
		{"::/0", KindCIDR, "::/0"},
		{"PyPI.org", KindDomain, "pypi.org"},
		{"pypi.org.", KindDomain, "pypi.org"},
		{"_dmarc.example.com", KindDomain, "_dmarc.example.com"},
		{"localhost", KindDomain, "localhost"},
		{"*.pythonhosted.org", KindWildcard, ".pythonhosted.org"},
		{"*.A.Example.COM", KindWildcard, ".a.example.com"},
	} {
		kind, v, err := ParseEntry(c.in)
		if err != nil || kind != c.kind || fmt.Sprint(v) != c.want {
			t.Errorf("ParseEntry(%q) = %s %v %v, want %s %s", c.in, kind, v, err, c.kind, c.want)
		}
	}
	for _, in := range []string{
		"", "10.0.0.0/33", "10.0.0.1/8", "10.0.0.1", "2001:db8::1", "fe80::/10%eth0", "1.2.3",
		"*", "*.com", "a.*.com", "exa mple.com", "-a.com", "a-.com", "a..com", ".a.com",
		"example.com:443", "http://example.com", strings.Repeat("a", 64) + ".com",
		strings.Repeat("abcdefgh.", 32) + "com", "example.123", "é.com",
	} {
		if _, _, err := ParseEntry(in); err == nil {
			t.Errorf("ParseEntry(%q) accepted", in)
		}
	}
}

func TestParseNamesTheBadEntry(t *testing.T) {
	_, err := Parse([]string{"pypi.org", "*.pythonhosted.org"}, []string{"10.0.0.0/8", "10.0.0.0/33"})
	var ee *EntryError
	if !errors.As(err, &ee) || ee.List != "deny" || ee.Index != 1 || ee.Entry != "10.0.0.0/33" {
		t.Fatalf("Parse: %v", err)
	}
	if !strings.Contains(err.Error(), `network.deny[1]: "10.0.0.0/33"`) {
		t.Errorf("message %q does not name the entry", err)
	}
	long := make([]string, MaxEntries+1)
	for i := range long {
		long[i] = fmt.Sprintf("h%d.example.com", i)
	}
	if _, err := Parse(long, nil); !errors.Is(err, ErrTooMany) || !strings.Contains(err.Error(), "network.allow") {
		t.Errorf("a list too long: %v", err)
	}
	if _, err := Parse(long[:MaxEntries], long[:MaxEntries]); err != nil {
		t.Errorf("lists of MaxEntries: %v", err)
	}
}

func TestRules(t *testing.T) {
	r, err := Parse(
		[]string{"pypi.org", "*.pythonhosted.org", "*.example.com", "198.51.100.0/24", "2001:db8::/32"},
		[]string{"evil.example.com", "*.bad.example.com", "198.51.100.66/32", "2001:db8:bad::/48"},
	)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"pypi.org":                      true,
		"PYPI.ORG.":                     true,
		"www.pypi.org":                  false, // exact only
		"files.pythonhosted.org":        true,
		"a.b.pythonhosted.org":          true,
		"pythonhosted.org":              false, // a wildcard is its subdomains
		"xpythonhosted.org":             false,
		"api.example.com":               true,
		"evil.example.com":              false, // deny wins
		"x.bad.example.com":             false,
		"bad.example.com":               true, // *.bad.… denies its subdomains only
		"github.com":                    false,
		"":                              false,
		"not a name":                    false,
		"198.51.100.7":                  false, // CIDRs do not match names
		"pypi.org\x00.attacker.example": false,
	} {
		if got := r.Name(name); got != want {
			t.Errorf("Name(%q) = %v, want %v", name, got, want)
		}
	}
	if !r.NameDenied("evil.example.com") || r.NameDenied("api.example.com") || !r.NameDenied("bad name") {
		t.Error("NameDenied")
	}
	for addr, want := range map[string]bool{
		"198.51.100.7":        true,
		"198.51.100.66":       false, // deny wins
		"::ffff:198.51.100.7": true,  // mapped
		"203.0.113.1":         false,
		"2001:db8::1":         true,
		"2001:db8:bad::1":     false,
		"2001:db9::1":         false,
	} {
		if got := r.Addr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Addr(%s) = %v, want %v", addr, got, want)
		}
	}
	if !r.AddrDenied(netip.MustParseAddr("198.51.100.66")) || r.AddrDenied(netip.MustParseAddr("198.51.100.7")) {
		t.Error("AddrDenied")
	}
	allow, deny := r.Prefixes()
	if len(allow) != 2 || len(deny) != 2 {
		t.Errorf("Prefixes = %v, %v", allow, deny)
	}

	// The zero value and empty lists allow nothing.
	var zero Rules
	if zero.Name("pypi.org") || zero.Addr(netip.MustParseAddr("198.51.100.7")) {
		t.Error("the zero Rules allow something")
	}
	all, err := Parse([]string{"0.0.0.0/0", "::/0"}, nil)
	if err != nil || !all.Addr(netip.MustParseAddr("8.8.8.8")) || all.Name("pypi.org") {
		t.Errorf("allow every address: %v", err)
	}
}

func FuzzParseEntry(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "*.a.com", "a.com", "::/0", "", "*", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		kind, v, err := ParseEntry(s)
		if err != nil {
			return
		}
		// What parses, parses again to the same thing from its canonical
		// form.
		var canon string
		switch kind {
		case KindCIDR:
			canon = v.(netip.Prefix).String()
		case KindDomain:
			canon = v.(string)
		case KindWildcard:
			canon = "*" + v.(string)
		}
		k2, v2, err := ParseEntry(canon)
		if err != nil || k2 != kind || fmt.Sprint(v2) != fmt.Sprint(v) {
			t.Fatalf("%q → %s %v → %q → %s %v %v", s, kind, v, canon, k2, v2, err)
		}
	})
}
