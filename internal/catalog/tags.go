package catalog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// Tags: a template "name" may have more names, "name:tag", each pointing
// at the digest of one build. The untagged name is the tag "default" (the
// templates row); the others are template_tags rows. A build names what
// its BuildOptions.Tags list when it succeeds (only the default, unless
// told); a build ID stands for a tag too ("name:bld_…"), while a name or
// tag still keeps that build's files.

// BuildOptions are the choices of a build that are not its spec.
type BuildOptions struct {
	// ID is the build's id: "" for a new one, or one NewBuildID made (an
	// id handed out before the build starts, as E2B's build API does).
	ID string
	// Tags the build takes when it succeeds; none is the default tag.
	Tags []string
	// Cmd is recorded on the template, not run (a Dockerfile's
	// ENTRYPOINT and CMD).
	Cmd []string
}

// NewBuildID returns a new build id.
func NewBuildID() string { return store.NewID("bld") }

// maxTags bounds the tags of one build (or one Tag call), and
// maxTemplateTags those of one template.
const (
	maxTags         = 16
	maxTemplateTags = 256
)

// tagRoom refuses tags that would give the template more than
// maxTemplateTags.
func (s *Service) tagRoom(ctx context.Context, teamID, name string, tags []string) error {
	rows, err := s.store.ListTags(ctx, teamID, name)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, r := range rows {
		have[r.Tag] = true
	}
	n := len(have)
	for _, t := range tags {
		if t != template.DefaultTag && !have[t] {
			n++
		}
	}
	if n > maxTemplateTags {
		return errorf(client.CodeBadRequest, "template %s would have %d tags: at most %d (remove some: evalbox template rm %s:TAG)", name, n, maxTemplateTags, name)
	}
	return nil
}

// buildKey is what two builds at once may not share: the team, the name
// and the tags (sorted). Builds of one name under other tags run side by
// side.
type buildKey struct{ team, name, tags string }

// checkTags checks and sorts a build's tags, DefaultTag for none.
func checkTags(tags []string) ([]string, error) {
	if len(tags) == 0 {
		return []string{template.DefaultTag}, nil
	}
	if len(tags) > maxTags {
		return nil, errorf(client.CodeBadRequest, "%d tags: at most %d", len(tags), maxTags)
	}
	for _, t := range tags {
		if !template.ValidTag(t) {
			return nil, errorf(client.CodeBadRequest, "tag %q: want 1–128 of A-Z a-z 0-9 . _ -, starting with a letter or digit", t)
		}
	}
	out := slices.Clone(tags)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// refOf is how a log line names a template and its tags.
func refOf(name string, tags []string) string {
	if len(tags) == 1 && tags[0] == template.DefaultTag {
		return name
	}
	return name + ":" + strings.Join(tags, ",")
}

// name points the template's tags at t, the result of build id, and
// returns the digests they pointed at before.
func (s *Service) name(ctx context.Context, teamID, name string, tags []string, t *template.Template, id string) ([]string, error) {
	var olds []string
	for _, tag := range tags {
		var old string
		var err error
		if tag == template.DefaultTag {
			old, err = s.store.PutTemplate(ctx, store.TemplateRow{TeamID: teamID, Name: name, Digest: t.Digest, Source: t.Source, BuildID: id})
		} else {
			old, err = s.store.PutTag(ctx, store.TagRow{TeamID: teamID, Template: name, Tag: tag, Digest: t.Digest, BuildID: id})
		}
		if err != nil {
			return olds, err
		}
		if old != "" {
			olds = append(olds, old)
		}
	}
	return olds, nil
}

// teamDigests are the digests the team's names and tags point at.
func (s *Service) teamDigests(ctx context.Context, teamID string) (map[string]bool, error) {
	rows, err := s.store.ListTemplates(ctx, teamID)
	if err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	tags, err := s.store.ListTags(ctx, teamID, "")
	if err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	out := map[string]bool{}
	for _, r := range rows {
		out[r.Digest] = true
	}
	for _, t := range tags {
		out[t.Digest] = true
	}
	return out, nil
}

// pointer is what a team's template reference resolves to.
type pointer struct {
	name, tag       string
	digest, buildID string
	source          string
}

// notFound is the answer for a reference that names nothing. For a tag,
// its words are E2B's ("tag … does not exist"), which clients such as
// Harbor read as "the build is not ready yet".
func notFound(name, tag string) error {
	if tag == template.DefaultTag {
		return errorf(client.CodeNotFound, "template %q not found", name)
	}
	return errorf(client.CodeNotFound, "tag %q does not exist for template %q", tag, name)
}

// resolve finds what a team's template reference ("name", "name:tag",
// "name:<build id>") points at.
func (s *Service) resolve(ctx context.Context, teamID, ref string) (pointer, error) {
	name, tag := template.SplitRef(ref)
	if !template.ValidName(name) || !template.ValidTag(tag) || teamID == "" {
		return pointer{}, errorf(client.CodeNotFound, "template %q not found", ref)
	}
	p := pointer{name: name, tag: tag}
	if tag == template.DefaultTag {
		row, err := s.store.GetTemplate(ctx, teamID, name)
		if errors.Is(err, store.ErrNotFound) {
			return p, notFound(name, tag)
		}
		p.digest, p.buildID, p.source = row.Digest, row.BuildID, row.Source
		return p, err
	}
	row, err := s.store.GetTag(ctx, teamID, name, tag)
	if err == nil {
		p.digest, p.buildID = row.Digest, row.BuildID
		return p, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return p, err
	}
	if _, ok := store.IDBytes("bld", tag); ok {
		b, err := s.store.GetBuild(ctx, teamID, tag)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return p, err
		case b.Template == name && b.State == client.BuildStateSucceeded && b.Digest != "":
			p.digest, p.buildID = b.Digest, b.ID
			return p, nil
		}
	}
	return p, notFound(name, tag)
}

// Tags lists the tags of the team's template name, the default first (if
// the name has one); a name with neither is not found.
func (s *Service) Tags(ctx context.Context, teamID, name string) ([]client.TemplateTag, error) {
	if !template.ValidName(name) || template.IsBuiltin(name) {
		return nil, errorf(client.CodeNotFound, "template %q not found", name)
	}
	out := []client.TemplateTag{}
	row, err := s.store.GetTemplate(ctx, teamID, name)
	switch {
	case err == nil:
		out = append(out, client.TemplateTag{Tag: template.DefaultTag, Digest: row.Digest, BuildID: row.BuildID, CreatedAt: row.CreatedAt})
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	rows, err := s.store.ListTags(ctx, teamID, name)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		out = append(out, client.TemplateTag{Tag: r.Tag, Digest: r.Digest, BuildID: r.BuildID, CreatedAt: r.CreatedAt})
	}
	if len(out) == 0 {
		return nil, errorf(client.CodeNotFound, "template %q not found", name)
	}
	return out, nil
}

// Tag points tags of the template name at what target ("name:tag" or
// "name:<build id>" of the same name, or a bare tag or build id) points
// at, and returns that build's id.
func (s *Service) Tag(ctx context.Context, teamID, name, target string, tags []string) (string, error) {
	if template.IsBuiltin(name) {
		return "", errorf(client.CodeBadRequest, "%s is a built-in template: it takes no tags", name)
	}
	if !strings.Contains(target, ":") {
		target = name + ":" + target
	}
	if tn, _ := template.SplitRef(target); tn != name {
		return "", errorf(client.CodeBadRequest, "target %q is not a tag of %s", target, name)
	}
	tags, err := checkTags(tags)
	if err != nil {
		return "", err
	}
	if err := s.tagRoom(ctx, teamID, name, tags); err != nil {
		return "", err
	}
	p, err := s.resolve(ctx, teamID, target)
	if err != nil {
		return "", err
	}
	// The files stay while they are pinned here, so that a concurrent
	// move of the target's own tag cannot collect them in between.
	release := s.pin(p.digest)
	defer release()
	t, err := s.reg.Get(p.digest)
	if err != nil {
		return "", notFound(p.name, p.tag)
	}
	if t.Source == "" {
		t.Source = p.source
	}
	olds, err := s.name(ctx, teamID, name, tags, t, p.buildID)
	for _, old := range olds {
		if old != p.digest {
			s.collect(ctx, old)
		}
	}
	if err != nil {
		return "", err
	}
	s.log.Info("template tagged", "team", teamID, "template", name, "tags", tags, "build", p.buildID)
	return p.buildID, nil
}

// Untag removes tags of the team's template name (not the default: Delete
// removes the name). Running sandboxes of a tag keep running.
func (s *Service) Untag(ctx context.Context, teamID, name string, tags []string) error {
	tags, err := checkTags(tags)
	if err != nil {
		return err
	}
	if slices.Contains(tags, template.DefaultTag) {
		return errorf(client.CodeBadRequest, "the default tag is the template's name: delete the template to remove it")
	}
	for _, tag := range tags {
		if _, err := s.store.GetTag(ctx, teamID, name, tag); errors.Is(err, store.ErrNotFound) {
			return notFound(name, tag)
		} else if err != nil {
			return err
		}
	}
	for _, tag := range tags {
		d, err := s.store.DeleteTag(ctx, teamID, name, tag)
		if errors.Is(err, store.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		s.collect(ctx, d)
	}
	s.log.Info("template untagged", "team", teamID, "template", name, "tags", tags)
	return nil
}
