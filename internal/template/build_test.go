package template_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/gvisor"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// buildEnv is a template store with a real node running gVisor build
// sandboxes, and a base template (the Debian rootfs of the tests).
type buildEnv struct {
	reg     *template.Registry
	node    *node.Node
	builder *template.Builder
	base    *template.Template
}

func newBuildEnv(t *testing.T) *buildEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("builds need root")
	}
	bin := os.Getenv("EVALBOX_BIN_DIR")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin")
	}
	runsc, agent := filepath.Join(bin, "runsc"), filepath.Join(bin, "evalbox-agent")
	for _, p := range []string{runsc, agent} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s missing: run scripts/build.sh (or set EVALBOX_BIN_DIR)", p)
		}
	}
	rootfs := os.Getenv("EVALBOX_TEST_ROOTFS")
	if rootfs == "" {
		rootfs = "/tmp/tpl-base"
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin/sh")); err != nil {
		t.Skipf("no test root filesystem at %s (set EVALBOX_TEST_ROOTFS)", rootfs)
	}
	reg, err := template.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.UseStore(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	scope := fmt.Sprintf("evalbox-tpl-test-%d", os.Getpid())
	netm, err := network.New(network.Config{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	gv, err := gvisor.New(gvisor.Config{Runsc: runsc, RootDir: t.TempDir(), CgroupParent: scope, Network: netm})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Runtimes: []runtime.Runtime{gv}, Templates: reg, AgentPath: agent, StateDir: t.TempDir(),
		Build: node.BuildConfig{CPU: 1, MemoryMB: 512, DiskMB: 256}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(context.Background()); err != nil {
			t.Errorf("close node: %v", err)
		}
		if err := gv.Close(); err != nil {
			t.Errorf("close gvisor: %v", err)
		}
	})
	sum := sha256.Sum256([]byte("test base " + rootfs))
	base := &template.Template{Name: "base", Digest: "sha256:" + hex.EncodeToString(sum[:]), RootFS: rootfs, Source: template.SourceBuiltin,
		Defaults: template.Defaults{CPU: 1, MemoryMB: 256, DiskMB: 256, Workdir: "/work", User: "root",
			Env: map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}}
	return &buildEnv{reg: reg, node: n, builder: template.NewBuilder(reg, n, nil), base: base}
}

func (e *buildEnv) build(t *testing.T, ctx context.Context, id string, steps ...client.TemplateStep) (template.BuildResult, string, error) {
	t.Helper()
	var log strings.Builder
	res, err := e.builder.Build(ctx, template.BuildRequest{ID: id, Name: "t", From: e.base, Network: client.NetworkNone, Log: &log,
		Spec: client.TemplateSpec{From: "base", Steps: steps}})
	return res, log.String(), err
}

// assertClean checks that builds left no mounts, work dirs or sandboxes.
func (e *buildEnv) assertClean(t *testing.T, ids ...string) {
	t.Helper()
	if m := e.reg.Mounts(); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if entries, _ := os.ReadDir(filepath.Join(e.reg.StoreDir(), "tmp")); len(entries) > 0 {
		t.Errorf("work dirs left: %v", entries)
	}
	for _, id := range ids {
		if left := e.node.Leftovers(id); len(left) > 0 {
			t.Errorf("build sandbox %s left: %v", id, left)
		}
	}
}

func TestBuildLayersAndCache(t *testing.T) {
	e := newBuildEnv(t)
	ctx := context.Background()
	steps := []client.TemplateStep{
		{Run: "echo one > /one && rm /etc/hostname"},
		{Env: map[string]string{"N": "2"}},
		{Workdir: "/data"},
		{Run: "echo $N > two && mkdir -p /var/cache && rm -rf /var/cache/* && touch /var/cache/only"},
	}
	r1, log, err := e.build(t, ctx, "bld-a", steps...)
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	if r1.Built != 2 || r1.Cached != 0 || r1.Steps != 4 {
		t.Errorf("first build: %+v", r1)
	}
	tpl := r1.Template
	for p, want := range map[string]string{"one": "one\n", "data/two": "2\n"} {
		if b, err := os.ReadFile(filepath.Join(tpl.RootFS, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(tpl.RootFS, "etc/hostname")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deleted file is in the template: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(tpl.RootFS, "var/cache")); len(entries) != 1 {
		t.Errorf("var/cache: %v", entries)
	}
	if fi, err := os.Stat(filepath.Join(tpl.RootFS, ".evalbox/agent")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("no agent mount point: %v", err)
	}
	if tpl.Defaults.Workdir != "/data" || tpl.Defaults.Env["N"] != "2" || len(tpl.Layers) != 2 || tpl.Source != template.SourceBuild {
		t.Errorf("template: %+v", tpl)
	}

	// Same inputs: everything cached, same digest.
	r2, log, err := e.build(t, ctx, "bld-b", steps...)
	if err != nil || r2.Cached != 2 || r2.Built != 0 || r2.Template.Digest != tpl.Digest {
		t.Errorf("second build: %+v %v\n%s", r2, err, log)
	}
	// The last step changed: only it runs.
	steps[3].Run = "echo changed > two"
	r3, log, err := e.build(t, ctx, "bld-c", steps...)
	if err != nil || r3.Cached != 1 || r3.Built != 1 || r3.Template.Digest == tpl.Digest {
		t.Errorf("third build: %+v %v\n%s", r3, err, log)
	}
	// An env step before a run step changes the run step's layer.
	steps[1].Env["N"] = "3"
	r4, log, err := e.build(t, ctx, "bld-d", steps...)
	if err != nil || r4.Cached != 1 || r4.Built != 1 {
		t.Errorf("fourth build: %+v %v\n%s", r4, err, log)
	}
	e.assertClean(t, "bld-a-1", "bld-a-4", "bld-c-4", "bld-d-4")
}

func TestBuildFailures(t *testing.T) {
	e := newBuildEnv(t)
	layersBefore, _ := e.reg.Layers()
	_, log, err := e.build(t, context.Background(), "bld-f", client.TemplateStep{Run: "echo partial > /partial; echo broken >&2; exit 5"})
	var se *template.StepError
	if !errors.As(err, &se) || se.Step != 1 || se.ExitCode != 5 || !strings.Contains(err.Error(), "step 1 (run) failed: exit code 5: broken") {
		t.Errorf("failing step: %v\n%s", err, log)
	}
	// A step killed by the build's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err = e.build(t, ctx, "bld-g", client.TemplateStep{Run: "sleep 60"})
	if err == nil || time.Since(start) > 30*time.Second {
		t.Errorf("cancelled build: %v after %v", err, time.Since(start))
	}
	// An unknown user fails the step that runs as it.
	_, _, err = e.build(t, context.Background(), "bld-h", client.TemplateStep{User: "nobody-here"}, client.TemplateStep{Run: "true"})
	if !errors.As(err, &se) || se.Step != 2 {
		t.Errorf("unknown user: %v", err)
	}
	layersAfter, _ := e.reg.Layers()
	if len(layersAfter) != len(layersBefore) {
		t.Errorf("failed builds left layers: %v", layersAfter)
	}
	if stored, _ := e.reg.Stored(); len(stored) != 0 {
		t.Errorf("failed builds left templates: %v", stored)
	}
	e.assertClean(t, "bld-f-1", "bld-g-1", "bld-h-2")
}

// buildFor builds steps for a team with a network setting.
func (e *buildEnv) buildFor(t *testing.T, id, teamID, network string, steps ...client.TemplateStep) template.BuildResult {
	t.Helper()
	var log strings.Builder
	res, err := e.builder.Build(context.Background(), template.BuildRequest{ID: id, TeamID: teamID, Name: "t", From: e.base,
		Network: network, Log: &log, Spec: client.TemplateSpec{From: "base", Steps: steps}})
	if err != nil {
		t.Fatalf("build %s: %v\n%s", id, err, log.String())
	}
	return res
}

// TestLayerCacheNetwork: a run step's layer is cached with the network
// it ran with: the same step without network does not reuse the layer of
// a run with it (it used to).
func TestLayerCacheNetwork(t *testing.T) {
	e := newBuildEnv(t)
	step := client.TemplateStep{Run: "echo net > /net-marker"}
	var log strings.Builder
	r1, err := e.builder.Build(context.Background(), template.BuildRequest{ID: "bld-n1", Name: "t", From: e.base,
		Network: client.NetworkOutbound, Log: &log, Spec: client.TemplateSpec{From: "base", Steps: []client.TemplateStep{step}}})
	if err != nil || r1.Built != 1 {
		t.Fatalf("with network: %+v %v\n%s", r1, err, log.String())
	}
	r2, _, err := e.build(t, context.Background(), "bld-n2", step) // network: none
	if err != nil || r2.Built != 1 || r2.Cached != 0 || r2.Template.Digest == r1.Template.Digest {
		t.Errorf("without network: %+v %v (the layer built with network was reused?)", r2, err)
	}
	r3, _, err := e.build(t, context.Background(), "bld-n3", step)
	if err != nil || r3.Cached != 1 || r3.Template.Digest != r2.Template.Digest {
		t.Errorf("again without network: %+v %v", r3, err)
	}
	e.assertClean(t, "bld-n1-1", "bld-n2-1")
}

// TestLayerCacheTeams: a team never gets a layer (nor a template) another
// team built from the same spec; its own rebuild is cached.
func TestLayerCacheTeams(t *testing.T) {
	e := newBuildEnv(t)
	steps := []client.TemplateStep{{Run: "date +%s%N > /when"}, {Copy: nil, Env: map[string]string{"X": "1"}}}
	a1 := e.buildFor(t, "bld-ta1", "team_a", client.NetworkNone, steps...)
	b1 := e.buildFor(t, "bld-tb1", "team_b", client.NetworkNone, steps...)
	if b1.Cached != 0 || b1.Built != 1 || b1.Template.Digest == a1.Template.Digest {
		t.Errorf("team b's build of team a's spec: %+v", b1)
	}
	a2 := e.buildFor(t, "bld-ta2", "team_a", client.NetworkNone, steps...)
	if a2.Cached != 1 || a2.Template.Digest != a1.Template.Digest {
		t.Errorf("team a's rebuild: %+v", a2)
	}
	read := func(r template.BuildResult) string {
		b, _ := os.ReadFile(filepath.Join(r.Template.RootFS, "when"))
		return string(b)
	}
	if read(a1) == read(b1) || read(a1) != read(a2) {
		t.Errorf("/when: a %q, b %q, a again %q", read(a1), read(b1), read(a2))
	}
	e.assertClean(t, "bld-ta1-1", "bld-tb1-1")
}
