package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestSnapshots(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		sn := client.Snapshot{ID: "snap-aaaaaaaaaaaaaaaa", TeamID: a.ID, SandboxID: "sb-1", Template: "python", TemplateDigest: "sha256:t1",
			Runtime: "gvisor", RuntimeVersion: "runsc/x", CPU: 1, MemoryMB: 512, DiskMB: 256, Network: "rules",
			NetworkRules: &client.NetworkRuleLists{Allow: []string{"pypi.org"}, Deny: []string{}}, Memory: true, SizeBytes: 1000, NodeID: "n1"}
		got, err := s.InsertSnapshot(ctx, sn)
		if err != nil || got.CreatedAt.IsZero() {
			t.Fatalf("insert: %+v %v", got, err)
		}
		if _, err := s.InsertSnapshot(ctx, sn); !errors.Is(err, ErrConflict) {
			t.Errorf("duplicate: %v", err)
		}
		second := sn
		second.ID, second.SizeBytes, second.NetworkRules, second.Network, second.Memory = "snap-bbbbbbbbbbbbbbbb", 24, nil, "none", false
		second.CreatedAt = got.CreatedAt.Add(time.Second)
		if _, err := s.InsertSnapshot(ctx, second); err != nil {
			t.Fatal(err)
		}
		back, err := s.GetSnapshot(ctx, a.ID, sn.ID)
		if err != nil || !reflect.DeepEqual(back, got) {
			t.Errorf("get:\n%+v\nwant\n%+v (%v)", back, got, err)
		}
		if _, err := s.GetSnapshot(ctx, b.ID, sn.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team's: %v", err)
		}
		if node, err := s.SnapshotNode(ctx, sn.ID); err != nil || node != "n1" {
			t.Errorf("node: %q %v", node, err)
		}
		l, err := s.ListSnapshots(ctx, a.ID)
		if err != nil || len(l) != 2 || l[0].ID != second.ID || l[1].ID != sn.ID {
			t.Errorf("list: %+v %v", l, err)
		}
		if l, err := s.ListSnapshots(ctx, b.ID); err != nil || len(l) != 0 {
			t.Errorf("another team's list: %+v %v", l, err)
		}
		if n, err := s.SnapshotBytes(ctx, a.ID); err != nil || n != 1024 {
			t.Errorf("bytes: %d %v", n, err)
		}
		if n, err := s.SnapshotBytes(ctx, b.ID); err != nil || n != 0 {
			t.Errorf("another team's bytes: %d %v", n, err)
		}
		// A snapshot keeps its template's digest in use.
		if in, err := s.DigestInUse(ctx, "sha256:t1"); err != nil || !in {
			t.Errorf("digest of a snapshot in use: %v %v", in, err)
		}
		if d, err := s.TemplateDigests(ctx); err != nil || !d["sha256:t1"] {
			t.Errorf("template digests: %v %v", d, err)
		}
		if _, err := s.DeleteSnapshot(ctx, b.ID, sn.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team's delete: %v", err)
		}
		if del, err := s.DeleteSnapshot(ctx, a.ID, sn.ID); err != nil || del.ID != sn.ID || del.NodeID != "n1" {
			t.Errorf("delete: %+v %v", del, err)
		}
		if _, err := s.DeleteSnapshot(ctx, a.ID, sn.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
		if _, err := s.DeleteSnapshot(ctx, a.ID, second.ID); err != nil {
			t.Fatal(err)
		}
		if in, err := s.DigestInUse(ctx, "sha256:t1"); err != nil || in {
			t.Errorf("digest after the snapshots went: %v %v", in, err)
		}

		// A sandbox paused and resumed; restored from a snapshot.
		sb, err := s.InsertSandbox(ctx, client.Sandbox{TeamID: a.ID, Template: "python", Runtime: "gvisor", CPU: 1, MemoryMB: 1, DiskMB: 1,
			Network: "none", ExpiresAt: time.Now().Add(time.Hour), Snapshot: sn.ID})
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		if err := s.SetPaused(ctx, a.ID, sb.ID, &at); err != nil {
			t.Fatal(err)
		}
		if err := s.SetPaused(ctx, b.ID, sb.ID, &at); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team's pause: %v", err)
		}
		row, err := s.GetSandbox(ctx, a.ID, sb.ID)
		if err != nil || row.PausedAt == nil || !row.PausedAt.Equal(norm(at)) || row.State != client.StateRunning || row.Snapshot != sn.ID {
			t.Errorf("paused row: %+v %v", row, err)
		}
		if err := s.SetPaused(ctx, a.ID, sb.ID, nil); err != nil {
			t.Fatal(err)
		}
		if row, err := s.GetSandbox(ctx, a.ID, sb.ID); err != nil || row.PausedAt != nil {
			t.Errorf("resumed row: %+v %v", row, err)
		}
	})
}
