package template

import (
	"context"
	"errors"
	"testing"

	"github.com/evalbox/evalbox/pkg/client"
)

func TestNormalizeImage(t *testing.T) {
	for ref, want := range map[string]string{"python": "python:latest", "docker.io/library/python:3.12": "python:3.12",
		"ghcr.io/a/b": "ghcr.io/a/b:latest", "localhost:5000/x": "localhost:5000/x:latest", "localhost:5000/x:1": "localhost:5000/x:1"} {
		if got := NormalizeImage(ref); got != want {
			t.Errorf("NormalizeImage(%q) = %q, want %q", ref, got, want)
		}
	}
}

// TestResolveImage: a template of that name first, else an import of that
// image (as Docker compares references), else none; built templates are
// never matched by their base.
func TestResolveImage(t *testing.T) {
	all := []client.Template{
		{Name: "python", Source: "builtin"},
		{Name: "py312", Source: "import", From: "docker.io/library/python:3.12-slim@sha256:abc"},
		{Name: "mine", Source: "build", From: "ubuntu:24.04"},
	}
	get := func(_ context.Context, name string) (client.Template, error) {
		for _, t := range all {
			if t.Name == name {
				return t, nil
			}
		}
		return client.Template{}, errors.New("no such template")
	}
	list := func(context.Context) ([]client.Template, error) { return all, nil }
	for ref, want := range map[string]string{"python": "python", "python:3.12-slim": "py312", "library/python:3.12-slim": "py312",
		"ubuntu:24.04": "", "python:3.13": "", "py312": "py312",
		"python:3.12-slim@sha256:abc": "py312", "python:3.12-slim@sha256:def": ""} {
		got, ok, err := ResolveImage(context.Background(), ref, get, list)
		if err != nil || ok != (want != "") || got.Name != want {
			t.Errorf("ResolveImage(%q) = %q %v %v, want %q", ref, got.Name, ok, err, want)
		}
	}
}
