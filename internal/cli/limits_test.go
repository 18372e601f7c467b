package cli

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/limits"
)

// TestLimitsMarkdownIsDocs: `evalbox limits --markdown` prints
// docs/limits.md's table (between its markers).
func TestLimitsMarkdownIsDocs(t *testing.T) {
	b, err := os.ReadFile("../../docs/limits.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- BEGIN limits.Markdown()")
	_, rest, ok2 := strings.Cut(rest, "-->\n")
	table, _, ok3 := strings.Cut(rest, "<!-- END limits.Markdown() -->")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/limits.md has no generated table")
	}
	r := runCLI(t, "", "limits", "--markdown").ok(t)
	if r.stdout != table {
		t.Errorf("evalbox limits --markdown differs from docs/limits.md (go test ./internal/limits -run TestDocs -update):\n%s", r.stdout)
	}
	r = runCLI(t, "", "limits").ok(t)
	for _, l := range limits.All() {
		if !strings.Contains(r.stdout, l.Name) {
			t.Errorf("evalbox limits: no %s", l.Name)
		}
	}
}

// TestServeFlagsMatchLimits: every flag of the limits table is a serve
// flag whose default is the table's, so that docs/limits.md cannot drift
// from `evalbox serve`.
func TestServeFlagsMatchLimits(t *testing.T) {
	fs := newServeCmd().Flags()
	for _, l := range limits.All() {
		if l.Flag == "" {
			continue
		}
		f := fs.Lookup(l.Flag)
		if f == nil {
			t.Errorf("%s: evalbox serve has no --%s", l.Name, l.Flag)
			continue
		}
		var want string
		switch v := l.Default.(type) {
		case time.Duration:
			s := seconds(v)
			want = s.String()
		case float64:
			want = strconv.FormatFloat(v, 'g', -1, 64)
		case int:
			want = strconv.Itoa(v)
		}
		if f.DefValue != want {
			t.Errorf("--%s defaults to %q, the table's %s is %q", l.Flag, f.DefValue, l.Name, want)
		}
	}
}
