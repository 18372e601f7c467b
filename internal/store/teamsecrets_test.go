package store

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestTeamSecrets: a team's secrets are its own (another team's name is not
// found), a put replaces the value and keeps the creation time, listing
// gives no sealed value, and a reseal loses to a put made since it read.
func TestTeamSecrets(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		t0 := time.Now().Add(-time.Hour)
		created, err := s.PutTeamSecret(ctx, a.ID, "OPENAI_API_KEY", []byte("sealed-1"), t0)
		if err != nil || !created {
			t.Fatalf("first put = %v, %v; want created", created, err)
		}
		created, err = s.PutTeamSecret(ctx, a.ID, "OPENAI_API_KEY", []byte("sealed-2"), t0.Add(time.Minute))
		if err != nil || created {
			t.Fatalf("second put = %v, %v; want a replacement", created, err)
		}
		got, err := s.GetTeamSecret(ctx, a.ID, "OPENAI_API_KEY")
		if err != nil || !bytes.Equal(got.Sealed, []byte("sealed-2")) {
			t.Fatalf("get = %+v, %v", got, err)
		}
		if !got.CreatedAt.Equal(norm(t0)) || !got.UpdatedAt.Equal(norm(t0.Add(time.Minute))) {
			t.Errorf("times = %v, %v; want %v, %v", got.CreatedAt, got.UpdatedAt, norm(t0), norm(t0.Add(time.Minute)))
		}
		if _, err := s.GetTeamSecret(ctx, b.ID, "OPENAI_API_KEY"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another team's get = %v, want ErrNotFound", err)
		}
		if err := s.DeleteTeamSecret(ctx, b.ID, "OPENAI_API_KEY"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another team's delete = %v, want ErrNotFound", err)
		}
		if _, err := s.PutTeamSecret(ctx, "no-such-team", "X", []byte("s"), t0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("put for an unknown team = %v, want ErrNotFound", err)
		}
		if _, err := s.PutTeamSecret(ctx, b.ID, "B", []byte("sealed-b"), t0); err != nil {
			t.Fatal(err)
		}
		list, err := s.ListTeamSecrets(ctx, a.ID)
		if err != nil || len(list) != 1 || list[0].Name != "OPENAI_API_KEY" || list[0].Sealed != nil {
			t.Fatalf("list = %+v, %v", list, err)
		}

		// A reseal of a value read before a put does not undo the put.
		var seen []TeamSecret
		if err := s.EachTeamSecret(ctx, func(ts TeamSecret) error { seen = append(seen, ts); return nil }); err != nil || len(seen) != 2 {
			t.Fatalf("each = %+v, %v", seen, err)
		}
		if _, err := s.PutTeamSecret(ctx, a.ID, "OPENAI_API_KEY", []byte("sealed-3"), t0); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.ResealTeamSecret(ctx, a.ID, "OPENAI_API_KEY", []byte("sealed-2"), []byte("resealed")); err != nil || ok {
			t.Fatalf("stale reseal = %v, %v; want not applied", ok, err)
		}
		if ok, err := s.ResealTeamSecret(ctx, a.ID, "OPENAI_API_KEY", []byte("sealed-3"), []byte("resealed")); err != nil || !ok {
			t.Fatalf("reseal = %v, %v; want applied", ok, err)
		}
		if got, _ := s.GetTeamSecret(ctx, a.ID, "OPENAI_API_KEY"); !bytes.Equal(got.Sealed, []byte("resealed")) {
			t.Fatalf("after reseal: %q", got.Sealed)
		}
		if err := s.DeleteTeamSecret(ctx, a.ID, "OPENAI_API_KEY"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTeamSecret(ctx, a.ID, "OPENAI_API_KEY"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete = %v, want ErrNotFound", err)
		}
	})
}
