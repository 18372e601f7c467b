package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestSnapshotTemplate: a template built from: snapshot:ID has the
// snapshot's files (written, owned, deleted) under its own steps, on both
// runtimes, whichever runtime took the snapshot (a gVisor one holds memory:
// its files come from a throwaway restore); it outlives the snapshot; a
// second build finds the layer cached; a snapshot that is not the team's,
// or none, is refused before anything is kept; "snapshot" names no
// template.
func TestSnapshotTemplate(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{client.RuntimeGVisor, client.RuntimeNamespaces} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 6, MaxConcurrentExec: 8})
			ctx := ctxT(t, 10*time.Minute)
			src := mustCreate(t, c, client.CreateSandboxRequest{Template: "python", Runtime: rt, Timeout: 600})
			mustExec(t, c, src.ID, client.ExecRequest{Cmd: "set -e; mkdir -p /work; echo prepared > /work/state; " +
				"useradd -m trial; echo mine > /home/trial/f; chown trial /home/trial/f; chmod 600 /home/trial/f; " +
				"rm -rf /usr/share/doc"})
			sn, err := c.Snapshot(ctx, src.ID)
			if err != nil {
				t.Fatal(err)
			}
			if sn.Memory != (rt == client.RuntimeGVisor) {
				t.Fatalf("snapshot %+v", sn)
			}
			if err := c.DeleteSandbox(ctx, src.ID); err != nil {
				t.Fatal(err)
			}
			name := "from-snap-" + rt
			deleteTemplateAtEnd(t, c, name)
			spec := mustParse(t, "from: snapshot:"+sn.ID+"\nsteps:\n  - run: cat /work/state > /work/copy\n")
			build := func() (*client.TemplateBuild, string) {
				t.Helper()
				b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: name, Spec: spec}, nil)
				if err != nil {
					t.Fatalf("build: %v", err)
				}
				var log strings.Builder
				end, err := c.FollowBuild(ctx, name, b.ID, &log)
				if err != nil || end.State != client.BuildStateSucceeded {
					t.Fatalf("build: %+v %v\n%s", end, err, log.String())
				}
				return end, log.String()
			}
			first, log := build()
			if !strings.Contains(log, "snapshot:"+sn.ID+"'s files DONE") {
				t.Errorf("first build's log:\n%s", log)
			}
			// Built again: the layer is cached, the template the same.
			second, log := build()
			if !strings.Contains(log, "snapshot:"+sn.ID+"'s files CACHED") || second.Digest != first.Digest {
				t.Errorf("second build %s, first %s; log:\n%s", second.Digest, first.Digest, log)
			}
			// The snapshot goes; the template keeps its files.
			if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
				t.Fatal(err)
			}
			check := "cat /work/state /work/copy; su trial -c 'cat /home/trial/f'; stat -c '%U %a' /home/trial/f; " +
				"test ! -e /usr/share/doc && echo doc-gone; python3 -c 'print(6*7)'"
			want := "prepared\nprepared\nmine\ntrial 600\ndoc-gone\n42\n"
			for _, use := range []string{client.RuntimeGVisor, client.RuntimeNamespaces} {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Template: name, Runtime: use})
				deleteAtEnd(t, c, *sb)
				if got := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: check}); got.Stdout != want {
					t.Errorf("a %s sandbox of the template sees %q (stderr %q), want %q", use, got.Stdout, got.Stderr, want)
				}
			}
			// A build from the deleted snapshot is refused.
			_, err = c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: name, Spec: spec}, nil)
			wantCode(t, "a build from a deleted snapshot", err, http.StatusBadRequest, client.CodeBadRequest)
		})
	}

	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 2})
	other := defaultTeam(t)
	ctx := ctxT(t, 2*time.Minute)
	src := mustCreate(t, other, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces})
	deleteAtEnd(t, other, *src)
	theirs, err := other.Snapshot(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.DeleteSnapshot(context.Background(), theirs.ID) })
	for what, from := range map[string]string{
		"another team's snapshot": "snapshot:" + theirs.ID,
		"a snapshot never taken":  "snapshot:snap-aaaaaaaaaaaaaaaa",
		"no snapshot id":          "snapshot:",
	} {
		_, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "refused", Spec: client.TemplateSpec{From: from}}, nil)
		wantCode(t, what, err, http.StatusBadRequest, client.CodeBadRequest)
	}
	_, err = c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "snapshot", Spec: client.TemplateSpec{From: "base"}}, nil)
	wantCode(t, "a template named snapshot", err, http.StatusBadRequest, client.CodeBadRequest)
	if ts, err := c.ListTemplates(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, tp := range ts {
			if tp.Name == "refused" || tp.Name == "snapshot" {
				t.Errorf("a refused build left template %+v", tp)
			}
		}
	}
}
