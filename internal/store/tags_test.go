package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

func TestTemplateTags(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := mustTeam(t, s, "a"), mustTeam(t, s, "b")
		old, err := s.PutTag(ctx, TagRow{TeamID: a.ID, Template: "task", Tag: "v1", Digest: "sha256:1", BuildID: "bld_1"})
		if err != nil || old != "" {
			t.Fatalf("put: %q %v", old, err)
		}
		if old, err = s.PutTag(ctx, TagRow{TeamID: a.ID, Template: "task", Tag: "v1", Digest: "sha256:2", BuildID: "bld_2"}); err != nil || old != "sha256:1" {
			t.Fatalf("move: %q %v", old, err)
		}
		if _, err := s.PutTag(ctx, TagRow{TeamID: a.ID, Template: "task", Tag: "c2-m4096", Digest: "sha256:3", BuildID: "bld_3"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutTag(ctx, TagRow{TeamID: a.ID, Template: "other", Tag: "v1", Digest: "sha256:4", BuildID: "bld_4"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutTag(ctx, TagRow{TeamID: "team_nope", Template: "x", Tag: "v", Digest: "sha256:9", BuildID: "b"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown team: %v", err)
		}
		r, err := s.GetTag(ctx, a.ID, "task", "v1")
		if err != nil || r.Digest != "sha256:2" || r.BuildID != "bld_2" || r.CreatedAt.IsZero() {
			t.Errorf("get: %+v %v", r, err)
		}
		// Another team sees nothing of it.
		if _, err := s.GetTag(ctx, b.ID, "task", "v1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("other team get: %v", err)
		}
		if l, err := s.ListTags(ctx, b.ID, ""); err != nil || len(l) != 0 {
			t.Errorf("other team list: %+v %v", l, err)
		}
		l, err := s.ListTags(ctx, a.ID, "task")
		if err != nil || len(l) != 2 || l[0].Tag != "c2-m4096" || l[1].Tag != "v1" {
			t.Errorf("list: %+v %v", l, err)
		}
		if l, _ := s.ListTags(ctx, a.ID, ""); len(l) != 3 || l[0].Template != "other" {
			t.Errorf("list all: %+v", l)
		}
		// A tag keeps its digest in use, and among the digests kept.
		if in, _ := s.DigestInUse(ctx, "sha256:3"); !in {
			t.Error("sha256:3 of a tag not in use")
		}
		if in, _ := s.DigestInUse(ctx, "sha256:1"); in {
			t.Error("sha256:1, replaced, in use")
		}
		if _, err := s.PutTemplate(ctx, TemplateRow{TeamID: a.ID, Name: "task", Digest: "sha256:2", Source: "build", BuildID: "bld_2"}); err != nil {
			t.Fatal(err)
		}
		if d, _ := s.TemplateDigests(ctx); !reflect.DeepEqual(d, map[string]bool{"sha256:2": true, "sha256:3": true, "sha256:4": true}) {
			t.Errorf("digests: %v", d)
		}
		// Sandboxes of a tag count as the template's; a name sharing the
		// prefix does not, nor does a LIKE wildcard in it.
		for _, tmpl := range []string{"task", "task:v1", "task2", "tas_"} {
			sb := newSandbox(a.ID, nil)
			sb.Template, sb.TemplateDigest = tmpl, "sha256:2"
			if _, err := s.InsertSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		if n, _ := s.CountRunningByTemplate(ctx, a.ID, "task"); n != 2 {
			t.Errorf("running of task: %d, want 2", n)
		}
		if n, _ := s.CountRunningByTemplate(ctx, a.ID, "tas_"); n != 1 {
			t.Errorf("running of tas_: %d, want 1", n)
		}
		if d, err := s.DeleteTag(ctx, a.ID, "task", "v1"); err != nil || d != "sha256:2" {
			t.Errorf("delete: %q %v", d, err)
		}
		if _, err := s.DeleteTag(ctx, a.ID, "task", "v1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete again: %v", err)
		}
		if _, err := s.DeleteTag(ctx, b.ID, "task", "c2-m4096"); !errors.Is(err, ErrNotFound) {
			t.Errorf("other team delete: %v", err)
		}
	})
}
