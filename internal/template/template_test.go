package template

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestByDigest: a node finds a built-in and a stored template by digest
// alone, never by a name.
func TestByDigest(t *testing.T) {
	dir := t.TempDir()
	builtin, stored := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	write := func(d, name, digest string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(d, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "template.json"), []byte(`{"name":"`+name+`","digest":"`+digest+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "builtins", "base"), "base", builtin)
	r, err := Open(filepath.Join(dir, "builtins"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.UseStore(filepath.Join(dir, "store")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dir, "store", templatesDir, hexOf(stored)), "mine", stored)
	for range 2 { // uncached, then cached
		if tpl, err := r.ByDigest(builtin); err != nil || tpl.Name != "base" || tpl.Source != SourceBuiltin {
			t.Fatalf("built-in by digest: %+v, %v", tpl, err)
		}
		if tpl, err := r.ByDigest(stored); err != nil || tpl.Name != "mine" || tpl.RootFS == "" {
			t.Fatalf("stored by digest: %+v, %v", tpl, err)
		}
	}
	for _, d := range []string{"base", "sha256:" + strings.Repeat("3", 64), "sha256:12"} {
		if _, err := r.ByDigest(d); !errors.Is(err, ErrNotFound) {
			t.Errorf("ByDigest(%q): %v, want ErrNotFound", d, err)
		}
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"python": true, "my-task": true, "a.b_c": true, "snapshot-runner": true,
		"": false, "-x": false, "Upper": false, "snap-wsis4vanzc4aaexe": false, "snap-": false,
	} {
		if got := ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}
