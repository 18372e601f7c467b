// Package docs holds the project's documents to the code they cite.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSecurityCitesRealTests: every test SECURITY.md names as evidence of
// a guarantee exists, so that renaming or deleting one changes the page
// too.
func TestSecurityCitesRealTests(t *testing.T) {
	page, err := os.ReadFile("../../SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "../.." || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cited := regexp.MustCompile("`(Test[A-Za-z0-9_]+)[`*/ (]").FindAllSubmatch(page, -1)
	if len(cited) < 20 {
		t.Fatalf("SECURITY.md cites %d tests; the pattern no longer finds them", len(cited))
	}
	for _, m := range cited {
		if name := string(m[1]); !defined[name] {
			t.Errorf("SECURITY.md cites %s, which no test file defines", name)
		}
	}
}
