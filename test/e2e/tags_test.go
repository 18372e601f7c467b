package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestTemplateTags: a template's tags ("name:tag") name builds beside its
// untagged name; sandboxes start from a tag or a build id; tags move,
// are removed, and go with the name; another team sees none of it.
func TestTemplateTags(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 8})
	other := defaultTeam(t)
	const name = "tagged"
	deleteTemplateAtEnd(t, c, name)
	spec := func(v string) client.TemplateSpec {
		return mustParse(t, fmt.Sprintf("from: base\nsteps:\n  - run: echo %s > /v\n", v))
	}
	build := func(v string, tags ...string) *client.TemplateBuild {
		t.Helper()
		ctx := ctxT(t, 5*time.Minute)
		b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: name, Spec: spec(v), Tags: tags}, nil)
		if err != nil {
			t.Fatalf("build %s %v: %v", v, tags, err)
		}
		var log strings.Builder
		end, err := c.FollowBuild(ctx, name, b.ID, &log)
		if err != nil || end.State != client.BuildStateSucceeded {
			t.Fatalf("build %s %v: %+v %v\n%s", v, tags, end, err, log.String())
		}
		return end
	}
	version := func(ref string) string {
		t.Helper()
		sb := mustCreate(t, c, client.CreateSandboxRequest{Template: ref, Runtime: client.RuntimeNamespaces})
		defer c.DeleteSandbox(context.Background(), sb.ID)
		res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cat /v"})
		return strings.TrimSpace(res.Stdout)
	}

	v1 := build("one")
	v2 := build("two", "v2")
	if got := version(name); got != "one" {
		t.Errorf("%s after a build of :v2: %q, want one (a tagged build leaves the name)", name, got)
	}
	for ref, want := range map[string]string{name + ":v2": "two", name + ":default": "one", name + ":" + v1.ID: "one", name + ":" + v2.ID: "two"} {
		if got := version(ref); got != want {
			t.Errorf("%s: %q, want %q", ref, got, want)
		}
	}

	// Builds of other tags of one name run side by side; the same tags
	// twice at once are a conflict.
	var wg sync.WaitGroup
	for _, v := range []string{"a", "b"} {
		wg.Go(func() { build(v, v) })
	}
	wg.Wait()
	first, err := c.BuildTemplate(ctxT(t, time.Minute), client.BuildTemplateRequest{Name: name, Spec: mustParse(t, "from: base\nsteps:\n  - run: sleep 3 && echo c > /v\n"), Tags: []string{"c"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.BuildTemplate(ctxT(t, time.Minute), client.BuildTemplateRequest{Name: name, Spec: spec("c2"), Tags: []string{"c"}}, nil); !client.IsConflict(err) {
		t.Errorf("a second build of :c at once: %v, want a conflict", err)
	}
	if end, err := c.FollowBuild(ctxT(t, 5*time.Minute), name, first.ID, nil); err != nil || end.State != client.BuildStateSucceeded {
		t.Fatalf("build :c: %+v %v", end, err)
	}

	// A tag moves to what another names.
	if _, err := c.TagTemplate(ctxT(t, time.Minute), name, "v2", "stable"); err != nil {
		t.Fatal(err)
	}
	l, err := c.TemplateTags(ctxT(t, time.Minute), name)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tg := range l.Tags {
		got = append(got, tg.Tag)
		if tg.Tag == "stable" && (tg.BuildID != v2.ID || tg.Digest != v2.Digest) {
			t.Errorf("stable: %+v, want build %s %s", tg, v2.ID, v2.Digest)
		}
		if tg.Tag == "default" && tg.BuildID != v1.ID {
			t.Errorf("default: %+v, want build %s", tg, v1.ID)
		}
	}
	if strings.Join(got, " ") != "default a b c stable v2" {
		t.Errorf("tags %v", got)
	}
	if tm, err := c.GetTemplate(ctxT(t, time.Minute), name+":stable"); err != nil || tm.Digest != v2.Digest || tm.BuildID != v2.ID {
		t.Errorf("get :stable: %+v %v", tm, err)
	}

	// Bad input is refused and changes nothing.
	for what, err := range map[string]error{
		"bad tag": func() error {
			_, err := c.BuildTemplate(ctxT(t, time.Minute), client.BuildTemplateRequest{Name: name, Spec: spec("x"), Tags: []string{"no spaces"}}, nil)
			return err
		}(),
		"target of another name": func() error { _, err := c.TagTemplate(ctxT(t, time.Minute), name, "base:default", "x"); return err }(),
		"remove default":         c.DeleteTemplate(ctxT(t, time.Minute), name+":default"),
	} {
		if client.ErrorCode(err) != client.CodeBadRequest {
			t.Errorf("%s: %v, want bad_request", what, err)
		}
	}
	_, err = c.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: name + ":nope", Runtime: client.RuntimeNamespaces})
	if !client.IsNotFound(err) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("an unknown tag: %v", err)
	}
	if _, err := c.TagTemplate(ctxT(t, time.Minute), name, "nope", "x"); !client.IsNotFound(err) {
		t.Errorf("tag from an unknown tag: %v", err)
	}

	// Another team sees nothing of it.
	if _, err := other.TemplateTags(ctxT(t, time.Minute), name); !client.IsNotFound(err) {
		t.Errorf("other team's tags: %v", err)
	}
	for _, ref := range []string{name + ":v2", name + ":" + v2.ID} {
		if _, err := other.GetTemplate(ctxT(t, time.Minute), ref); !client.IsNotFound(err) {
			t.Errorf("other team get %s: %v", ref, err)
		}
		if _, err := other.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: ref, Runtime: client.RuntimeNamespaces}); !client.IsNotFound(err) {
			t.Errorf("other team create from %s: %v", ref, err)
		}
	}
	if err := other.DeleteTemplate(ctxT(t, time.Minute), name+":v2"); !client.IsNotFound(err) {
		t.Errorf("other team untag: %v", err)
	}

	// A template's tags are bounded.
	var tagErr error
	for i := 0; i < 20 && tagErr == nil; i++ {
		var tags []string
		for j := range 16 {
			tags = append(tags, fmt.Sprintf("t%d-%d", i, j))
		}
		_, tagErr = c.TagTemplate(ctxT(t, time.Minute), name, "stable", tags...)
	}
	if client.ErrorCode(tagErr) != client.CodeBadRequest || !strings.Contains(tagErr.Error(), "at most 256") {
		t.Errorf("the 257th tag: %v", tagErr)
	}

	// Removing a tag leaves the rest.
	if err := c.DeleteTemplate(ctxT(t, time.Minute), name+":v2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetTemplate(ctxT(t, time.Minute), name+":v2"); !client.IsNotFound(err) {
		t.Errorf(":v2 after its removal: %v", err)
	}
	if got := version(name + ":stable"); got != "two" {
		t.Errorf(":stable after :v2's removal: %q", got)
	}

	// A sandbox of a tag holds the name; then the name goes with its tags.
	sb := mustCreate(t, c, client.CreateSandboxRequest{Template: name + ":stable", Runtime: client.RuntimeNamespaces})
	if err := c.DeleteTemplate(ctxT(t, time.Minute), name); !client.IsConflict(err) {
		t.Errorf("delete while a sandbox of :stable runs: %v", err)
	}
	if err := c.DeleteSandbox(ctxT(t, time.Minute), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctxT(t, time.Minute), name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TemplateTags(ctxT(t, time.Minute), name); !client.IsNotFound(err) {
		t.Errorf("tags after the delete: %v", err)
	}
	list, err := c.ListTemplates(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, tm := range list {
		if strings.HasPrefix(tm.Name, name) {
			t.Errorf("listed after the delete: %s", tm.Name)
		}
	}
	assertNoSandboxes(t, c)
}
