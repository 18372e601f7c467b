package e2b

import (
	"regexp"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/catalog"
)

func TestBuildIDs(t *testing.T) {
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		id, u := newBuild()
		if !uuidRE.MatchString(u) || seen[u] {
			t.Fatalf("%s → %q: not a new UUID of version 8", id, u)
		}
		seen[u] = true
		if back, ok := evalboxBuildID(u); !ok || back != id {
			t.Fatalf("%s → %s → %q, %v", id, u, back, ok)
		}
		if back, ok := evalboxBuildID(strings.ToUpper(u)); !ok || back != id {
			t.Fatalf("upper case %s → %q, %v", u, back, ok)
		}
	}
	for _, u := range []string{"", "default", "bld_abc", "3fa85f64-5717-4562-b3fc-2c963f66afa6", // a v4 UUID
		"00000000-0000-8000-8000-000000000001", "zzzzzzzz-0000-8000-8000-000000000000"} {
		if id, ok := evalboxBuildID(u); ok {
			t.Errorf("%q → %q: not one of ours", u, id)
		}
	}
	if e2bBuildID("bld_x") != "" || e2bBuildID("sbx_"+catalog.NewBuildID()[4:]) != "" {
		t.Error("an id not of a build has an E2B form")
	}
}

func TestTemplateRef(t *testing.T) {
	id, u := newBuild()
	for ref, want := range map[string]string{
		"task": "task|default", "task:default": "task|default", "task:c2-m4096-r5": "task|c2-m4096-r5",
		"task:" + u: "task|" + id, "code-interpreter-v1": "code-interpreter|default", "task:": "task|default",
	} {
		name, tag, err := templateRef(ref)
		if err != nil || name+"|"+tag != want {
			t.Errorf("templateRef(%q) = %q %q %v, want %s", ref, name, tag, err, want)
		}
	}
	for _, ref := range []string{"", "Task", "a/b", "task:-x", "task:a:b", "task:" + strings.Repeat("x", 129)} {
		if _, _, err := templateRef(ref); err == nil {
			t.Errorf("templateRef(%q): no error", ref)
		}
	}
	if e2bRef("task:"+id) != "task:"+u || e2bRef("task:v1") != "task:v1" || e2bRef("task") != "task" {
		t.Errorf("e2bRef: %q", e2bRef("task:"+id))
	}
	if _, err := templateName("task:v1"); err == nil {
		t.Error("templateName of a tag: no error")
	}
}
