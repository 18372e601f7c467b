package instance

import (
	"os"
	"path/filepath"
	"testing"
)

func TestID(t *testing.T) {
	// The first 4 bytes of sha256("/var/lib/evalbox"), as servers have
	// named their cgroups and links since the first release.
	if got := ID("/var/lib/evalbox"); got != "180f56ff" {
		t.Errorf("ID = %q", got)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if ID("data") != ID(filepath.Join(wd, "data")) {
		t.Error("a relative data dir names another instance than its absolute path")
	}
	if GVisorCgroupParent("ab") != "evalbox-gv-ab" || NamespacesCgroupParent("ab") != "evalbox-ns-ab" {
		t.Error("cgroup parents")
	}
}
