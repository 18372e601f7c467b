package template

import (
	"context"
	"strings"

	"github.com/evalbox/evalbox/pkg/client"
)

// ResolveImage finds the template that an image reference of a Dockerfile's
// FROM (or of E2B's fromImage) names: the team's template of that name
// (get), else an image the team imported under that reference (list),
// compared as Docker compares them (NormalizeImage). False: neither.
func ResolveImage(ctx context.Context, ref string, get func(ctx context.Context, name string) (client.Template, error),
	list func(ctx context.Context) ([]client.Template, error)) (client.Template, bool, error) {
	if ValidName(ref) {
		if t, err := get(ctx, ref); err == nil {
			return t, true, nil
		}
	}
	all, err := list(ctx)
	if err != nil {
		return client.Template{}, false, err
	}
	want := NormalizeImage(ref)
	for _, t := range all {
		if t.Source != "import" {
			continue
		}
		from := t.From
		if !strings.Contains(ref, "@") {
			from, _, _ = strings.Cut(from, "@") // a tag names the import, whatever its digest
		}
		if NormalizeImage(from) == want {
			return t, true, nil
		}
	}
	return client.Template{}, false, nil
}

// NormalizeImage writes an image reference the way Docker reads it:
// docker.io/library/python:3.12 and python:3.12 are one; no tag is latest.
func NormalizeImage(ref string) string {
	ref = strings.TrimPrefix(strings.TrimPrefix(ref, "docker.io/"), "index.docker.io/")
	ref = strings.TrimPrefix(ref, "library/")
	last := ref[strings.LastIndexByte(ref, '/')+1:]
	if !strings.Contains(last, ":") && !strings.Contains(ref, "@") {
		ref += ":latest"
	}
	return ref
}
