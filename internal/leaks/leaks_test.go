package leaks

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/runtime/namespaces"
)

func TestIDLockFileIsTheRuntimes(t *testing.T) {
	if idLockFile != namespaces.DefaultIDLockFile {
		t.Fatalf("idLockFile %q, namespaces.DefaultIDLockFile %q", idLockFile, namespaces.DefaultIDLockFile)
	}
}

func TestCgroupMounts(t *testing.T) {
	mi := []string{
		`31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755`,
		`32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu`,
		`41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw`,
		`42 31 0:38 / /mnt/cg\0402 rw,relatime shared:5 - cgroup2 cgroup2 rw`,
		`43 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu`,
	}
	got := cgroupMounts(mi)
	want := []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/unified", "/mnt/cg 2"}
	if !slices.Equal(got, want) {
		t.Fatalf("cgroupMounts = %q, want %q", got, want)
	}
}

func TestNamesSandboxLink(t *testing.T) {
	for rule, want := range map[string]bool{
		"-A EVALBOX-FWD -i evb+ -j ACCEPT":         false,
		"-A EVALBOX-FWD -o evb+ -j DROP":           false,
		"-A FORWARD -i evb12 -j ACCEPT":            true,
		"-A FORWARD -i evb+ -o evb3 -j DROP":       true,
		"-A INPUT -m comment --comment evb -j LOG": false,
	} {
		if got := NamesSandboxLink(rule); got != want {
			t.Errorf("NamesSandboxLink(%q) = %v", rule, got)
		}
	}
}

func TestIsRunscOf(t *testing.T) {
	root := "/tmp/d/runsc"
	for argv, want := range map[string]bool{
		"/bin/runsc --root /tmp/d/runsc --platform=systrap run --detach sb-x": true,
		"runsc-sandbox --root=/tmp/d/runsc --log-fd=3 boot sb-x":              true,
		"runsc-gofer --root /tmp/d/runscx gofer sb-x":                         false,
		"/bin/runsc --root /tmp/e/runsc delete sb-x":                          false,
		"sleep 100 --root /tmp/d/runsc":                                       false,
		"/usr/local/bin/runsc --root /tmp/d/runsc":                            true,
	} {
		if got := isRunscOf(argv, root); got != want {
			t.Errorf("isRunscOf(%q) = %v", argv, got)
		}
	}
}

func TestDiff(t *testing.T) {
	base := Snapshot{KindIptables: {"filter: -A FORWARD -j EVALBOX-FWD", "filter: -A X"}, KindCgroups: {}}
	now := Snapshot{
		KindIptables: {"filter: -A FORWARD -j EVALBOX-FWD", "filter: -A FORWARD -j EVALBOX-FWD"},
		KindCgroups:  {"/sys/fs/cgroup/cpu/evalbox-gv-1/sb-a"},
	}
	got := now.Diff(base)
	want := []string{
		"cgroups: left: /sys/fs/cgroup/cpu/evalbox-gv-1/sb-a",
		"iptables rules: left: filter: -A FORWARD -j EVALBOX-FWD",
		"iptables rules: gone: filter: -A X",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if d := base.Diff(base); len(d) != 0 {
		t.Fatalf("a snapshot differs from itself: %q", d)
	}
}

// TestScanFindsByID makes things named like a sandbox's and finds them.
func TestScanFindsByID(t *testing.T) {
	dir := t.TempDir()
	id := "sb-leakstest" + strings.ReplaceAll(filepath.Base(dir), "_", "")
	id = strings.ToLower(id)
	if left := ByID(dir, id); len(left) != 0 {
		t.Fatalf("before: %q", left)
	}
	if err := os.MkdirAll(filepath.Join(dir, "sandboxes", id), 0o700); err != nil {
		t.Fatal(err)
	}
	left := ByID(dir, id)
	if len(left) != 1 || !strings.HasPrefix(left[0], "file: ") {
		t.Fatalf("state dir: %q", left)
	}
	h, err := Scan()
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Procs) == 0 || len(h.Mounts) == 0 || len(h.Links) == 0 {
		t.Fatalf("empty scan: %d procs, %d mounts, %d links", len(h.Procs), len(h.Mounts), len(h.Links))
	}
	snap := h.Snapshot(context.Background(), Server{DataDir: dir, PID: os.Getpid()})
	if got := snap[KindState]; len(got) != 1 || got[0] != filepath.Join(dir, "sandboxes", id) {
		t.Fatalf("state files %q", got)
	}
	only := Snapshot{KindState: snap[KindState]}
	if got := (Snapshot{}).Diff(only); len(got) != 1 || !strings.Contains(got[0], "state files: gone: ") {
		t.Fatalf("diff %q", got)
	}
}

func TestSandboxItems(t *testing.T) {
	d := "/tmp/d"
	s := Snapshot{
		KindIptables: {"filter: -A FORWARD -j EVALBOX-FWD", "filter: -A FORWARD -i evb3 -j ACCEPT"},
		KindMounts:   {"/tmp/d/runsc/null-netns (nsfs, root net:[4026532])", "/tmp/d/images/tmp/b1/root (overlay, root /)"},
		KindState:    {"/tmp/d/runsc/null-netns", "/tmp/d/sandboxes/sb-a"},
		KindCgroups:  {"/sys/fs/cgroup/cpu/evalbox-gv-1/sb-a"},
	}
	got := s.SandboxItems(d)
	want := []string{
		"mounts: /tmp/d/images/tmp/b1/root (overlay, root /)",
		"cgroups: /sys/fs/cgroup/cpu/evalbox-gv-1/sb-a",
		"iptables rules: filter: -A FORWARD -i evb3 -j ACCEPT",
		"state files: /tmp/d/sandboxes/sb-a",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("SandboxItems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestOthersRules: the rules of a sandbox link another instance holds are
// not this server's; those of its own links and of absent links are.
func TestOthersRules(t *testing.T) {
	rules := []string{
		"filter: -A FORWARD -j EVALBOX-FWD",
		"filter: -A EVALBOX-SB -i evb3 -j EVALBOX-SB-3",
		"filter: chain EVALBOX-SB-3",
		"nat: chain EVALBOX-PX-3",
		"filter: -A EVALBOX-SB-3 -j RETURN",
		"filter: -A EVALBOX-SB -i evb4 -j EVALBOX-SB-4",
		"nat: chain EVALBOX-PX-4",
		"filter: -A EVALBOX-SB -i evb5 -j EVALBOX-SB-5",
		"filter: -A EVALBOX-FWD -i evb+ -j DROP",
		"filter: -A EVALBOX-SB -i evb30 -j EVALBOX-SB-30",
	}
	links := []Link{
		{Name: "evb3", Alias: "evalbox:other:sb-x"},
		{Name: "evb4", Alias: "evalbox:me:sb-y"},
		{Name: "evb30", Alias: ""}, // being made by someone: no chain of ours yet
		{Name: "lo"},
	}
	got := othersRules(rules, links, "me")
	want := []string{
		"filter: -A FORWARD -j EVALBOX-FWD",
		"filter: -A EVALBOX-SB -i evb4 -j EVALBOX-SB-4",
		"nat: chain EVALBOX-PX-4",
		"filter: -A EVALBOX-SB -i evb5 -j EVALBOX-SB-5",
		"filter: -A EVALBOX-FWD -i evb+ -j DROP",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("othersRules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for rule, want := range map[string]string{
		"filter: -A EVALBOX-SB -i evb12 -j EVALBOX-SB-12": "12",
		"nat: chain EVALBOX-PX-7":                         "7",
		"filter: -A EVALBOX-FWD -i evb+ -j DROP":          "",
		"filter: -A EVALBOX-SB-X -j RETURN":               "",
		"filter: -A X -i evb1x -j DROP":                   "",
	} {
		if n, _ := ruleLink(rule); n != want {
			t.Errorf("ruleLink(%q) = %q, want %q", rule, n, want)
		}
	}
}
