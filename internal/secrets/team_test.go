package secrets

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestVault: through a real (SQLite) store, a team's secret resolves for
// that team only, the database file never holds the value, a row copied
// to another team or name does not open there, and after a rotation the
// reseal moves every secret to the new key.
func TestVault(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, err := Load(filepath.Join(dir, "secrets.keys"))
	if err != nil {
		t.Fatal(err)
	}
	v := NewVault(keys, st, nil)
	a, err := st.CreateTeam(ctx, client.Team{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.CreateTeam(ctx, client.Team{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	const canary = "sk-vault-canary-7f3a9c"
	if created, err := v.Put(ctx, a.ID, "API_KEY", canary); err != nil || !created {
		t.Fatalf("put = %v, %v", created, err)
	}
	got, err := v.Resolve(ctx, a.ID, []string{"API_KEY"})
	if err != nil || got["API_KEY"] != canary {
		t.Fatalf("resolve = %v, %v", got, err)
	}
	if _, err := v.Resolve(ctx, b.ID, []string{"API_KEY"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another team's resolve = %v, want ErrNotFound", err)
	}
	if err := v.Delete(ctx, b.ID, "API_KEY"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another team's delete = %v, want ErrNotFound", err)
	}

	// The row moved to another team or name does not open there.
	row, err := st.GetTeamSecret(ctx, a.ID, "API_KEY")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutTeamSecret(ctx, b.ID, "API_KEY", row.Sealed, row.UpdatedAt); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutTeamSecret(ctx, a.ID, "OTHER", row.Sealed, row.UpdatedAt); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Resolve(ctx, b.ID, []string{"API_KEY"}); !errors.Is(err, ErrOpen) {
		t.Fatalf("a row copied to another team = %v, want ErrOpen", err)
	}
	if _, err := v.Resolve(ctx, a.ID, []string{"OTHER"}); !errors.Is(err, ErrOpen) {
		t.Fatalf("a row copied to another name = %v, want ErrOpen", err)
	}
	for _, name := range []string{"API_KEY", "OTHER"} {
		if err := v.Delete(ctx, map[string]string{"API_KEY": b.ID, "OTHER": a.ID}[name], name); err != nil {
			t.Fatal(err)
		}
	}

	// Rotation: the reseal moves the secret to the new key, which opens it;
	// a second reseal has nothing to do.
	id, err := keys.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	if n, err := v.Reseal(ctx); err != nil || n != 1 {
		t.Fatalf("reseal = %d, %v; want 1", n, err)
	}
	if row, _ := st.GetTeamSecret(ctx, a.ID, "API_KEY"); keys.NeedsReseal(row.Sealed) {
		t.Fatalf("after the reseal the secret is not under key %d", id)
	}
	if n, err := v.Reseal(ctx); err != nil || n != 0 {
		t.Fatalf("second reseal = %d, %v; want 0", n, err)
	}
	reloaded, err := Load(filepath.Join(dir, "secrets.keys"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := NewVault(reloaded, st, nil).Resolve(ctx, a.ID, []string{"API_KEY"}); err != nil || got["API_KEY"] != canary {
		t.Fatalf("resolve with the reloaded keyring = %v, %v", got, err)
	}

	// No file of the database holds the value.
	st.Close()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() == "secrets.keys" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(canary)) {
			t.Errorf("%s holds the secret's value", e.Name())
		}
	}
}
