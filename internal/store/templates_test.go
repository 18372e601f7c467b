package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestTemplateRows(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		old, err := s.PutTemplate(ctx, TemplateRow{TeamID: a.ID, Name: "task", Digest: "sha256:1", Source: "build", BuildID: "bld_1"})
		if err != nil || old != "" {
			t.Fatalf("put: %q %v", old, err)
		}
		if old, err = s.PutTemplate(ctx, TemplateRow{TeamID: a.ID, Name: "task", Digest: "sha256:2", Source: "build", BuildID: "bld_2"}); err != nil || old != "sha256:1" {
			t.Fatalf("replace: %q %v", old, err)
		}
		if _, err := s.PutTemplate(ctx, TemplateRow{TeamID: b.ID, Name: "task", Digest: "sha256:2", Source: "import", BuildID: "bld_3"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutTemplate(ctx, TemplateRow{TeamID: "team_nope", Name: "x", Digest: "sha256:9", Source: "build", BuildID: "b"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown team: %v", err)
		}
		r, err := s.GetTemplate(ctx, a.ID, "task")
		if err != nil || r.Digest != "sha256:2" || r.BuildID != "bld_2" {
			t.Errorf("get: %+v %v", r, err)
		}
		if _, err := s.GetTemplate(ctx, a.ID, "other"); !errors.Is(err, ErrNotFound) {
			t.Errorf("get unknown: %v", err)
		}
		list, err := s.ListTemplates(ctx, b.ID)
		if err != nil || len(list) != 1 || list[0].Source != "import" {
			t.Errorf("list b: %+v %v", list, err)
		}
		if d, _ := s.TemplateDigests(ctx); !reflect.DeepEqual(d, map[string]bool{"sha256:2": true}) {
			t.Errorf("digests: %v", d)
		}

		// In use: by a name, or by a running sandbox.
		if in, _ := s.DigestInUse(ctx, "sha256:1"); in {
			t.Error("sha256:1 in use")
		}
		sb := newSandbox(a.ID, nil)
		sb.Template, sb.TemplateDigest = "task", "sha256:1"
		sb, err = s.InsertSandbox(ctx, sb)
		if err != nil {
			t.Fatal(err)
		}
		if in, _ := s.DigestInUse(ctx, "sha256:1"); !in {
			t.Error("sha256:1 not in use with a running sandbox")
		}
		if n, _ := s.CountRunningByTemplate(ctx, a.ID, "task"); n != 1 {
			t.Errorf("running of a/task: %d", n)
		}
		if n, _ := s.CountRunningByTemplate(ctx, b.ID, "task"); n != 0 {
			t.Errorf("running of b/task: %d", n)
		}
		if _, err := s.MarkEnded(ctx, sb.ID, client.StateDeleted, "deleted", time.Now()); err != nil {
			t.Fatal(err)
		}
		if in, _ := s.DigestInUse(ctx, "sha256:1"); in {
			t.Error("sha256:1 in use after its sandbox ended")
		}

		if _, err := s.DeleteTemplate(ctx, b.ID, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete unknown: %v", err)
		}
		if d, err := s.DeleteTemplate(ctx, a.ID, "task"); err != nil || d != "sha256:2" {
			t.Errorf("delete: %q %v", d, err)
		}
		if in, _ := s.DigestInUse(ctx, "sha256:2"); !in {
			t.Error("sha256:2 is still b's")
		}
	})
}

func TestBuildRows(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		bld, err := s.InsertBuild(ctx, a.ID, client.TemplateBuild{Template: "task", Kind: client.BuildKindBuild, Steps: 3})
		if err != nil || bld.State != client.BuildStateQueued || bld.ID == "" {
			t.Fatalf("insert: %+v %v", bld, err)
		}
		if _, err := s.GetBuild(ctx, b.ID, bld.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team's build: %v", err)
		}
		start := time.Now().UTC()
		bld.State, bld.StartedAt = client.BuildStateRunning, &start
		if err := s.UpdateBuild(ctx, bld); err != nil {
			t.Fatal(err)
		}
		refs, err := s.ListBuildsByState(ctx, client.BuildStateQueued, client.BuildStateRunning)
		if err != nil || len(refs) != 1 || refs[0].TeamID != a.ID {
			t.Fatalf("active builds: %+v %v", refs, err)
		}
		end := start.Add(time.Second)
		bld.State, bld.FailedStep, bld.Error, bld.CachedSteps, bld.BuiltSteps, bld.FinishedAt = client.BuildStateFailed, 2, "step 2 (run) failed", 1, 1, &end
		if err := s.UpdateBuild(ctx, bld); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetBuild(ctx, a.ID, bld.ID)
		if err != nil {
			t.Fatal(err)
		}
		bld.StartedAt, bld.FinishedAt = normPtr(bld.StartedAt), normPtr(bld.FinishedAt)
		if !reflect.DeepEqual(got, bld) {
			t.Errorf("round trip:\n%+v\nwant\n%+v", got, bld)
		}
		if refs, _ := s.ListBuildsByState(ctx, client.BuildStateQueued, client.BuildStateRunning); len(refs) != 0 {
			t.Errorf("active builds after the end: %+v", refs)
		}
		if err := s.UpdateBuild(ctx, client.TemplateBuild{ID: "bld_nope"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("update unknown: %v", err)
		}
	})
}
