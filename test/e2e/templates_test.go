package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// cliAs runs the evalbox CLI with a team's key and returns stdout, stderr
// and the exit code.
func cliAs(t *testing.T, key string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "evalbox"), args...)
	cmd.Env = append(os.Environ(), "EVALBOX_API_URL="+srv.url, "EVALBOX_API_KEY="+key)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// buildAndWait builds spec through the API (with an optional context)
// and returns the build as it ended and its log.
func buildAndWait(t *testing.T, c *client.Client, name string, spec client.TemplateSpec, ctxTar io.Reader) (*client.TemplateBuild, string) {
	t.Helper()
	ctx := ctxT(t, 5*time.Minute)
	b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: name, Spec: spec}, ctxTar)
	if err != nil {
		t.Fatalf("build %s: %v", name, err)
	}
	var log strings.Builder
	end, err := c.FollowBuild(ctx, name, b.ID, &log)
	if err != nil {
		t.Fatalf("follow build %s: %v\n%s", b.ID, err, log.String())
	}
	return end, log.String()
}

// deleteTemplateAtEnd removes a team's template when the test ends.
func deleteTemplateAtEnd(t *testing.T, c *client.Client, name string) {
	t.Cleanup(func() {
		if err := c.DeleteTemplate(context.Background(), name); err != nil && !client.IsNotFound(err) {
			t.Errorf("delete template %s: %v", name, err)
		}
	})
}

// storeState is what the server's template store holds on the host.
type storeState struct {
	layers, templates, tmp []string
	mounts                 []string
}

func storeNow(t *testing.T) storeState {
	t.Helper()
	dir := filepath.Join(srv.dataDir, "images")
	ls := func(sub string) []string {
		entries, _ := os.ReadDir(filepath.Join(dir, sub))
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	st := storeState{layers: ls("layers"), templates: ls("templates"), tmp: ls("tmp")}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, dir) {
			st.mounts = append(st.mounts, line)
		}
	}
	return st
}

// assertNoBuildLeftovers checks that nothing of a build is left on the
// host: build sandboxes (processes, mounts, cgroups, state), work
// directories, overlay mounts.
func assertNoBuildLeftovers(t *testing.T, buildID string) {
	t.Helper()
	prefix := strings.ReplaceAll(buildID, "_", "-")
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for i := range 10 {
			left = append(left, hostLeftovers(srv, fmt.Sprintf("%s-%d", prefix, i))...)
		}
		st := storeNow(t)
		for _, m := range st.mounts {
			if strings.Contains(m, buildID) {
				left = append(left, "mount "+m)
			}
		}
		for _, d := range st.tmp {
			if strings.Contains(d, buildID) {
				left = append(left, "work dir "+d)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s left behind:\n  %s", buildID, strings.Join(left, "\n  "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// layersWith lists the cached layers that hold a file of this name at
// their root.
func layersWith(t *testing.T, file string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(srv.dataDir, "images", "layers", "*", file))
	return m
}

func TestBuiltinTemplates(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	checks := map[string][2]string{
		"base":   {"bash --version | head -1", "GNU bash"},
		"python": {"python3 -c 'import sys; print(sys.version)'", "3."},
		"node":   {"node -e 'console.log(1)'", "1"},
	}
	list, err := c.ListTemplatesUsage(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for name := range checks {
		i := slices.IndexFunc(list.Templates, func(tm client.Template) bool { return tm.Name == name })
		if i < 0 {
			t.Fatalf("built-in %s not listed: %+v", name, list.Templates)
		}
		if tm := list.Templates[i]; tm.Source != client.TemplateSourceBuiltin || tm.SizeBytes == 0 || !strings.HasPrefix(tm.Digest, "sha256:") {
			t.Errorf("built-in %s: %+v", name, tm)
		}
	}
	if list.DiskUsageBytes <= 0 {
		t.Errorf("disk usage %d", list.DiskUsageBytes)
	}
	var wg sync.WaitGroup
	for name, chk := range checks {
		for _, rt := range runtimes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := c.CreateSandbox(ctxT(t, 3*time.Minute), client.CreateSandboxRequest{Template: name, Runtime: rt})
				if err != nil {
					t.Errorf("%s on %s: %v", name, rt, err)
					return
				}
				defer func() {
					_ = c.DeleteSandbox(context.Background(), sb.ID)
					assertGone(t, srv, sb.ID)
				}()
				res, err := c.Exec(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Cmd: chk[0]})
				if err != nil || res.ExitCode != 0 || !strings.HasPrefix(strings.TrimSpace(res.Stdout), chk[1]) {
					t.Errorf("%s on %s: %q: %+v, %v", name, rt, chk[0], res, err)
				}
			}()
		}
	}
	wg.Wait()
}

// writeContextDir makes a build context with a directory to copy.
func writeContextDir(t *testing.T) string {
	dir := t.TempDir()
	for p, body := range map[string]string{"data/a.txt": "alpha\n", "data/sub/b.txt": "beta\n", "data/run.sh": "#!/bin/sh\necho ran\n", "unused.bin": "not sent"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "data/run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "data/link")); err != nil {
		t.Fatal(err)
	}
	return dir
}

const allStepsSpec = `# every step kind
from: base
steps:
  - run: |
      echo 'runner:x:1000:1000::/home/runner:/bin/bash' >> /etc/passwd
      echo 'runner:x:1000:' >> /etc/group
      mkdir -p /home/runner && chown 1000:1000 /home/runner
      rm /etc/hostname
  - env: {GREETING: hello, MODE: eval}
  - workdir: /app
  - copy: {src: data, dst: data}
  - run: cat data/a.txt > copied.txt && echo "$GREETING from $(pwd)" > env.txt && ./data/run.sh > ran.txt
  - user: runner
  - run: id -un > /home/runner/whoami
memory_mb: 256
ready_cmd: test -f /app/copied.txt
`

func TestTemplateBuildAllSteps(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	dir := writeContextDir(t)
	specPath := filepath.Join(dir, "spec.yaml")
	if err := os.WriteFile(specPath, []byte(allStepsSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, c, "all-steps")
	stdout, stderr, code := cliAs(t, key, "template", "build", "-f", specPath, "--name", "all-steps")
	if code != 0 {
		t.Fatalf("template build: exit %d\n%s%s", code, stdout, stderr)
	}
	digest := strings.TrimSpace(stdout)
	for _, want := range []string{"#1/7 run", "#4/7 copy data data", "#7 DONE", "ready_cmd test -f /app/copied.txt"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("build log lacks %q:\n%s", want, stderr)
		}
	}
	tm, err := c.GetTemplate(ctxT(t, time.Minute), "all-steps")
	if err != nil {
		t.Fatal(err)
	}
	if tm.Digest != digest || tm.Source != client.TemplateSourceBuild || tm.Workdir != "/app" || tm.User != "runner" ||
		tm.MemoryMB != 256 || tm.Env["GREETING"] != "hello" || len(tm.Layers) != 4 || tm.ReadyCmd == "" || tm.BuildID == "" {
		t.Errorf("template: %+v", tm)
	}
	for _, rt := range runtimes {
		sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "all-steps", Runtime: rt})
		if sb.TemplateDigest != digest || sb.MemoryMB != 256 {
			t.Errorf("%s: sandbox %+v", rt, sb)
		}
		res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: `id -un; pwd; echo "$GREETING $MODE"; cat data/a.txt data/sub/b.txt data/link copied.txt env.txt ran.txt /home/runner/whoami; stat -c '%a %U' data/run.sh data/a.txt; readlink data/link; test -e /etc/hostname || echo no-hostname`})
		want := "runner\n/app\nhello eval\nalpha\nbeta\nalpha\nalpha\nhello from /app\nran\nrunner\n755 root\n644 root\na.txt\n"
		if rt == client.RuntimeGVisor {
			// The namespaces runtime writes /etc/hostname itself.
			want += "no-hostname\n"
		}
		if res.ExitCode != 0 || res.Stdout != want {
			t.Errorf("%s: got %q (stderr %q), want %q", rt, res.Stdout, res.Stderr, want)
		}
		if res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "test -e unused.bin || test -e /unused.bin"}); res.ExitCode == 0 {
			t.Errorf("%s: a file no copy step names was sent", rt)
		}
	}

	// The same spec and context: the same digest, every layer from the
	// cache.
	b, log := buildAndWait(t, c, "all-steps-again", mustParse(t, allStepsSpec), contextTar(t, dir, "data"))
	deleteTemplateAtEnd(t, c, "all-steps-again")
	if b.State != client.BuildStateSucceeded || b.Digest != digest || b.CachedSteps != 4 || b.BuiltSteps != 0 {
		t.Errorf("rebuild: %+v\n%s", b, log)
	}

	// CLI listing, another team's view.
	out, _, code := cliAs(t, key, "template", "ls")
	if code != 0 || !strings.Contains(out, "all-steps") || !strings.Contains(out, "template store:") {
		t.Errorf("template ls: %d\n%s", code, out)
	}
	other := defaultTeam(t)
	if _, err := other.GetTemplate(ctxT(t, time.Minute), "all-steps"); !client.IsNotFound(err) {
		t.Errorf("another team's GET: %v", err)
	}
	if _, err := other.CreateSandbox(ctxT(t, time.Minute), client.CreateSandboxRequest{Template: "all-steps"}); !client.IsNotFound(err) {
		t.Errorf("another team's create: %v", err)
	}
	if err := other.DeleteTemplate(ctxT(t, time.Minute), "all-steps"); !client.IsNotFound(err) {
		t.Errorf("another team's delete: %v", err)
	}
	list, err := other.ListTemplates(ctxT(t, time.Minute))
	if err != nil || slices.ContainsFunc(list, func(tm client.Template) bool { return tm.Name == "all-steps" }) {
		t.Errorf("another team lists it: %v %+v", err, list)
	}
}

func mustParse(t *testing.T, yaml string) client.TemplateSpec {
	t.Helper()
	spec, err := template.ParseSpec([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// contextTar packs paths of dir (as the CLI does) into a tar archive.
func contextTar(t *testing.T, dir string, paths ...string) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		err := filepath.Walk(filepath.Join(dir, p), func(path string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, path)
			link := ""
			if info.Mode()&os.ModeSymlink != 0 {
				link, _ = os.Readlink(path)
			}
			hdr, err := tar.FileInfoHeader(info, link)
			if err != nil {
				return err
			}
			hdr.Name = rel
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if info.Mode().IsRegular() {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				_, err = tw.Write(b)
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestTemplateLayerCache(t *testing.T) {
	t.Parallel()
	c := defaultTeam(t)
	deleteTemplateAtEnd(t, c, "cache")
	spec := client.TemplateSpec{From: "base", Network: client.NetworkNone, Steps: []client.TemplateStep{
		{Run: "echo one > /one"},
		{Env: map[string]string{"N": "2"}},
		{Run: "echo $N > /two"},
		{Run: "echo three > /three"},
	}}
	b1, log1 := buildAndWait(t, c, "cache", spec, nil)
	if b1.State != client.BuildStateSucceeded || b1.BuiltSteps+b1.CachedSteps != 3 || b1.Steps != 4 {
		t.Fatalf("first build: %+v\n%s", b1, log1)
	}
	// Only the last step changes: only it runs.
	spec.Steps[3].Run = "echo THREE > /three"
	b2, log2 := buildAndWait(t, c, "cache", spec, nil)
	if b2.State != client.BuildStateSucceeded || b2.CachedSteps != 2 || b2.BuiltSteps != 1 || b2.Digest == b1.Digest {
		t.Fatalf("second build: %+v\n%s", b2, log2)
	}
	for _, want := range []string{"#1 CACHED", "#3 CACHED", "#4 DONE"} {
		if !strings.Contains(log2, want) {
			t.Errorf("second build log lacks %q:\n%s", want, log2)
		}
	}
	if strings.Contains(log2, "#1 DONE") || strings.Contains(log2, "#3 DONE") {
		t.Errorf("second build ran a cached step:\n%s", log2)
	}
	// The name now points at the new build; the log replays.
	tm, err := c.GetTemplate(ctxT(t, time.Minute), "cache")
	if err != nil || tm.Digest != b2.Digest {
		t.Fatalf("template after rebuild: %+v %v", tm, err)
	}
	var replay strings.Builder
	end, err := c.FollowBuild(ctxT(t, time.Minute), "cache", b1.ID, &replay)
	if err != nil || end.ID != b1.ID || replay.String() != log1 {
		t.Errorf("replay of build 1: %v %+v\n%q\nwant\n%q", err, end, replay.String(), log1)
	}
	sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "cache", Runtime: client.RuntimeNamespaces})
	if res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cat /one /two /three"}); res.Stdout != "one\n2\nTHREE\n" {
		t.Errorf("sandbox sees %q", res.Stdout)
	}
}

// testImage is a small image: a static program that prints its uid,
// working directory and environment, a data file and /etc/passwd, with an
// env, workdir and user in its config.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "showenv")
	build := exec.Command("go", "build", "-o", bin, "./testdata/showenv")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build showenv: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		mode int64
		body []byte
	}{
		{"bin/showenv", 0o755, prog},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n")},
		{"etc/group", 0o644, []byte("root:x:0:\napp:x:1000:\n")},
		{"srv/app/hello.txt", 0o644, []byte("hello from the image\n")},
	} {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerBytes := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{
		Env:        []string{"PATH=/bin", "GREETING=hello from oci"},
		WorkingDir: "/srv/app",
		User:       "app",
		Cmd:        []string{"/bin/showenv"},
	})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func TestTemplateImport(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	img := testImage(t)
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	tag, err := name.NewTag("example.test/showenv:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	manifest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	deleteTemplateAtEnd(t, c, "img-archive")
	deleteTemplateAtEnd(t, c, "img-layout")
	digests := map[string]string{}
	for tmpl, src := range map[string]string{"img-archive": archive, "img-layout": filepath.Join(dir, "layout")} {
		stdout, stderr, code := cliAs(t, key, "template", "import", "--name", tmpl, src)
		if code != 0 {
			t.Fatalf("import %s: exit %d\n%s%s", src, code, stdout, stderr)
		}
		digests[tmpl] = strings.TrimSpace(stdout)
		tm, err := c.GetTemplate(ctxT(t, time.Minute), tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if tm.Source != client.TemplateSourceImport || tm.Workdir != "/srv/app" || tm.User != "app" ||
			tm.Env["GREETING"] != "hello from oci" || !strings.Contains(tm.From, manifest.String()) ||
			!slices.Equal(tm.Cmd, []string{"/bin/showenv"}) {
			t.Errorf("%s: %+v", tmpl, tm)
		}
	}
	// One image, one digest, whichever way it came.
	if digests["img-archive"] != digests["img-layout"] {
		t.Errorf("digests differ: %v", digests)
	}
	for _, rt := range runtimes {
		sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "img-archive", Runtime: rt})
		res := mustExec(t, c, sb.ID, client.ExecRequest{Argv: []string{"/bin/showenv"}})
		for _, want := range []string{"uid=1000\n", "wd=/srv/app\n", "GREETING=hello from oci\n", "PATH=/bin\n"} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("%s: showenv lacks %q:\n%s%s", rt, want, res.Stdout, res.Stderr)
			}
		}
		rc, _, err := c.ReadFile(ctxT(t, time.Minute), sb.ID, "/srv/app/hello.txt")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "hello from the image\n" {
			t.Errorf("%s: hello.txt = %q", rt, b)
		}
	}
	// A build can start from an imported image.
	deleteTemplateAtEnd(t, c, "img-plus")
	b, log := buildAndWait(t, c, "img-plus", client.TemplateSpec{From: "img-archive", Steps: []client.TemplateStep{
		{Copy: &client.CopyStep{Src: "extra.txt", Dst: "extra.txt"}}}}, tarOf(t, map[string]string{"extra.txt": "more\n"}))
	if b.State != client.BuildStateSucceeded {
		t.Fatalf("build from an import: %+v\n%s", b, log)
	}
	sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "img-plus", Runtime: client.RuntimeGVisor})
	if rc, _, err := c.ReadFile(ctxT(t, time.Minute), sb.ID, "/srv/app/extra.txt"); err != nil {
		t.Errorf("extra.txt: %v", err)
	} else {
		rc.Close()
	}
}

// tarOf is a tar archive of regular files.
func tarOf(t *testing.T, files map[string]string) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range slices.Sorted(maps.Keys(files)) {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, files[n]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// postBuild sends a raw build request (JSON, or multipart with a context)
// and returns the status and body.
func postBuild(t *testing.T, key, request string, ctxTar []byte) (int, string) {
	t.Helper()
	if ctxTar == nil {
		return rawDo(t, "POST", srv.url+"/v1/templates", key, request)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	w, _ := mw.CreateFormField("request")
	io.WriteString(w, request)
	w, _ = mw.CreateFormFile("context", "context.tar")
	w.Write(ctxTar)
	mw.Close()
	req, err := http.NewRequest("POST", srv.url+"/v1/templates", &body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestTemplateBadInput(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	symlinkOut := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o755})
		tw.WriteHeader(&tar.Header{Name: "data/passwd", Typeflag: tar.TypeSymlink, Linkname: "../../etc/passwd"})
		tw.Close()
		return buf.Bytes()
	}
	cases := []struct {
		name, request string
		ctxTar        []byte
		want          string
	}{
		{"unknown step kind", `{"name":"bad","spec":{"from":"base","steps":[{"run":"true"},{"frobnicate":"x"}]}}`, nil,
			`step 2 (line 1): unknown step kind \"frobnicate\"`},
		{"missing from", `{"name":"bad","spec":{"steps":[{"run":"true"}]}}`, nil, "from is required"},
		{"unknown from", `{"name":"bad","spec":{"from":"nope"}}`, nil, `from: no template named \"nope\"`},
		{"copy outside the context", `{"name":"bad","spec":{"from":"base","steps":[{"copy":{"src":"../secret","dst":"/x"}}]}}`,
			tarBytesOf(t, map[string]string{"a": "x"}), `src \"../secret\" is outside the build context`},
		{"absolute copy source", `{"name":"bad","spec":{"from":"base","steps":[{"copy":{"src":"/etc/passwd","dst":"/x"}}]}}`,
			tarBytesOf(t, map[string]string{"a": "x"}), "is an absolute path"},
		{"symlink out of the context", `{"name":"bad","spec":{"from":"base","steps":[{"copy":{"src":"data","dst":"/x"}}]}}`,
			symlinkOut(), "outside the build context"},
		{"copy without a context", `{"name":"bad","spec":{"from":"base","steps":[{"copy":{"src":"a","dst":"/x"}}]}}`, nil,
			"no build context was sent"},
		{"corrupt context", `{"name":"bad","spec":{"from":"base","steps":[{"copy":{"src":"a","dst":"/x"}}]}}`,
			[]byte(strings.Repeat("garbage!", 200)), "build context: not a valid tar archive"},
		{"context escaping with ..", `{"name":"bad","spec":{"from":"base","steps":[{"copy":{"src":"a","dst":"/x"}}]}}`,
			tarBytesOf(t, map[string]string{"../../escape": "x"}), "leaves the archive's root"},
		{"built-in name", `{"name":"python","spec":{"from":"base"}}`, nil, "is a built-in template"},
	}
	for _, tc := range cases {
		status, body := postBuild(t, key, tc.request, tc.ctxTar)
		if status != 400 || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want 400 with %q", tc.name, status, body, tc.want)
		}
	}

	// The CLI names the problem before sending anything.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("from: base\nsteps:\n  - run: true\n  - frobnicate: x\n"), 0o644)
	if _, stderr, code := cliAs(t, key, "template", "build", "-f", filepath.Join(dir, "bad.yaml"), "--name", "bad"); code != 1 ||
		!strings.Contains(stderr, `step 2 (line 4): unknown step kind "frobnicate"`) {
		t.Errorf("CLI unknown step: %d %s", code, stderr)
	}

	// A failing run step: the build fails naming the step, its exit code
	// and stderr; the CLI exits 1 saying so.
	os.WriteFile(filepath.Join(dir, "fail.yaml"), []byte("from: base\nnetwork: none\nsteps:\n  - run: echo fine > /fine-bad-input\n"+
		"  - run: \"echo x > /failed-step-marker; echo about to fail; echo 'no such package: frob' >&2; exit 3\"\n"), 0o644)
	stdout, stderr, code := cliAs(t, key, "template", "build", "-f", filepath.Join(dir, "fail.yaml"), "--name", "bad")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "step 2 (run) failed: exit code 3: no such package: frob") ||
		!strings.Contains(stderr, "about to fail") {
		t.Errorf("CLI failing step: %d\n%s\n%s", code, stdout, stderr)
	}
	bad, log := buildAndWait(t, c, "bad", client.TemplateSpec{From: "base", Network: client.NetworkNone,
		Steps: []client.TemplateStep{{Run: "echo fine > /fine-bad-input"}, {Run: "echo x > /failed-step-marker; exit 7"}}}, nil)
	if bad.State != client.BuildStateFailed || bad.FailedStep != 2 || !strings.Contains(bad.Error, "step 2 (run) failed: exit code 7") {
		t.Errorf("failed build: %+v\n%s", bad, log)
	}
	assertNoBuildLeftovers(t, bad.ID)
	// A ready_cmd that fails.
	bad, log = buildAndWait(t, c, "bad", client.TemplateSpec{From: "base", ReadyCmd: "exit 4"}, nil)
	if bad.State != client.BuildStateFailed || !strings.Contains(bad.Error, "ready_cmd failed: exit code 4") {
		t.Errorf("ready_cmd: %+v\n%s", bad, log)
	}
	assertNoBuildLeftovers(t, bad.ID)

	// Imports: not a tar archive (refused at once), a tar that is no image,
	// and a docker-archive whose layer is missing (the import fails).
	for _, tc := range []struct {
		name string
		body []byte
		want string
	}{
		{"not a tar", []byte(strings.Repeat("junk", 300)), "not a valid tar archive"},
		{"no image", tarBytesOf(t, map[string]string{"hello.txt": "x"}), "neither a docker-archive"},
	} {
		req, _ := http.NewRequest("POST", srv.url+"/v1/templates/import?name=bad", bytes.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), tc.want) {
			t.Errorf("import %s: %d %s", tc.name, resp.StatusCode, body)
		}
	}
	broken := tarBytesOf(t, map[string]string{"manifest.json": `[{"Config":"cfg.json","RepoTags":["x:1"],"Layers":["missing.tar"]}]`, "cfg.json": `{}`})
	b, err := c.ImportTemplate(ctxT(t, time.Minute), client.ImportOptions{Name: "bad"}, bytes.NewReader(broken), int64(len(broken)))
	if err != nil {
		t.Fatal(err)
	}
	end, err := c.FollowBuild(ctxT(t, time.Minute), "bad", b.ID, nil)
	if err != nil || end.State != client.BuildStateFailed || end.Error == "" {
		t.Errorf("broken image: %+v %v", end, err)
	}
	assertNoBuildLeftovers(t, b.ID)
	if stdout, stderr, code := cliAs(t, key, "template", "import", "--name", "bad", filepath.Join(dir, "fail.yaml")); code != 1 ||
		!strings.Contains(stderr, "not a valid tar archive") {
		t.Errorf("CLI import of a non-archive: %d %s %s", code, stdout, stderr)
	}

	// Nothing of any of them is left: no template, no layer of a failed
	// step (the step before it is cached), no work dirs, no mounts.
	if _, err := c.GetTemplate(ctxT(t, time.Minute), "bad"); !client.IsNotFound(err) {
		t.Errorf("template bad exists: %v", err)
	}
	if l := layersWith(t, "failed-step-marker"); len(l) != 0 {
		t.Errorf("a failed step left its layer: %v", l)
	}
	if l := layersWith(t, "fine-bad-input"); len(l) != 1 {
		t.Errorf("the step before the failure should be cached once: %v", l)
	}
	list, err := c.ListTemplates(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, tm := range list {
		if tm.Source != client.TemplateSourceBuiltin {
			t.Errorf("team has template %+v", tm)
		}
	}
}

// tarBytesOf is tarOf as bytes; names are written as given.
func tarBytesOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	b, err := io.ReadAll(tarOf(t, files))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTemplateDeleteInUse(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 5, MaxConcurrentExec: 5})
	b, log := buildAndWait(t, c, "inuse", client.TemplateSpec{From: "base", Network: client.NetworkNone,
		Steps: []client.TemplateStep{{Run: "echo in use > /marker-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))}}}, nil)
	if b.State != client.BuildStateSucceeded {
		t.Fatalf("build: %+v\n%s", b, log)
	}
	sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "inuse", Runtime: client.RuntimeNamespaces})
	err := c.DeleteTemplate(ctxT(t, time.Minute), "inuse")
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 409 || apiErr.Code != client.CodeConflict || !strings.Contains(apiErr.Message, "1 running sandbox") {
		t.Fatalf("delete in use: %v", err)
	}
	if _, stderr, code := cliAs(t, key, "template", "rm", "inuse"); code != 1 || !strings.Contains(stderr, "conflict") {
		t.Errorf("CLI rm in use: %d %s", code, stderr)
	}
	if err := c.DeleteSandbox(ctxT(t, time.Minute), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := cliAs(t, key, "template", "rm", "inuse"); code != 0 {
		t.Fatalf("CLI rm: %d %s", code, stderr)
	}
	if _, err := c.GetTemplate(ctxT(t, time.Minute), "inuse"); !client.IsNotFound(err) {
		t.Errorf("after rm: %v", err)
	}
	if _, err := os.Stat(filepath.Join(srv.dataDir, "images", "templates", strings.TrimPrefix(b.Digest, "sha256:"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the template's files are still there: %v", err)
	}
	// Built-ins are not deletable.
	err = c.DeleteTemplate(ctxT(t, time.Minute), "base")
	if !errors.As(err, &apiErr) || apiErr.Status != 403 {
		t.Errorf("delete base: %v", err)
	}
}

// TestTemplateBuildQueueAndTimeout runs a server that takes one build per
// team at a time and stops builds after a few seconds.
func TestTemplateBuildQueueAndTimeout(t *testing.T) {
	t.Parallel()
	s := startServerT(t, serverOptions{args: []string{"--max-builds", "1", "--build-timeout", "4s"}})
	ctx := ctxT(t, 3*time.Minute)
	team, err := s.admin.CreateTeam(ctx, client.CreateTeamRequest{Name: "builds", Limits: &client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := s.admin.CreateKey(ctx, client.CreateKeyRequest{Name: "k", TeamID: team.ID})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(s.url, key.Key)
	spec := func(cmd string) client.TemplateSpec {
		return client.TemplateSpec{From: "base", Network: client.NetworkNone, Steps: []client.TemplateStep{{Run: cmd}}}
	}
	// Two builds of one team: the second waits for the first.
	b1, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "q1", Spec: spec("sleep 1.5; echo 1 > /q1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "q2", Spec: spec("echo 2 > /q2")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A second build of a name being built is a conflict.
	if _, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "q1", Spec: spec("true")}, nil); err == nil ||
		!strings.Contains(err.Error(), "being built already") {
		t.Errorf("concurrent build of one name: %v", err)
	}
	var log2 strings.Builder
	end2, err := c.FollowBuild(ctx, "q2", b2.ID, &log2)
	if err != nil {
		t.Fatal(err)
	}
	end1, err := c.GetBuild(ctx, "q1", b1.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end1.State != client.BuildStateSucceeded || end2.State != client.BuildStateSucceeded ||
		end2.StartedAt == nil || end1.FinishedAt == nil || end2.StartedAt.Before(*end1.FinishedAt) {
		t.Errorf("builds overlapped or failed:\n%+v\n%+v", end1, end2)
	}
	if !strings.Contains(log2.String(), "queued: the team runs 1 build(s) at once") {
		t.Errorf("the queued build's log does not say so:\n%s", log2.String())
	}
	// A build past the timeout fails, naming it, and leaves nothing.
	var log3 strings.Builder
	b3, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "slow", Spec: spec("sleep 60")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	end3, err := c.FollowBuild(ctx, "slow", b3.ID, &log3)
	if err != nil {
		t.Fatal(err)
	}
	if end3.State != client.BuildStateFailed || !strings.Contains(end3.Error, "timed out after 4s") || end3.FailedStep != 1 ||
		time.Since(start) > 30*time.Second {
		t.Errorf("slow build after %v: %+v\n%s", time.Since(start), end3, log3.String())
	}
	if _, err := c.GetTemplate(ctx, "slow"); !client.IsNotFound(err) {
		t.Errorf("template of a timed-out build: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		left = append(left, hostLeftovers(s, strings.ReplaceAll(b3.ID, "_", "-")+"-1")...)
		if entries, _ := os.ReadDir(filepath.Join(s.dataDir, "images", "tmp")); len(entries) > 0 {
			left = append(left, fmt.Sprint("work dirs ", entries))
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed-out build left: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTemplatesAcrossRestart kills the server during builds, at three
// points, restarting it on the same data dir each time: while a second run
// step runs on an overlay mount of the first's layer, while a first run
// step runs, and at a random moment (seeded) after a build was asked for
// (queued, starting its build sandbox, exporting a layer, …). After each
// restart the interrupted build is recorded as failed with a reason that
// says the server stopped, no template of it exists, no work dir, mount,
// build sandbox or half-made layer or template of it remains, and the
// templates built before still work. At the end the same spec builds.
func TestTemplatesAcrossRestart(t *testing.T) {
	t.Parallel()
	rng := crashRand(t)
	dir := t.TempDir()
	sweepOnCleanup(t, dir)
	s1, err := startServer(serverOptions{dataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 5*time.Minute)
	c := s1.admin
	spec := func(cmds ...string) client.TemplateSpec {
		sp := client.TemplateSpec{From: "base", Network: client.NetworkNone}
		for _, cmd := range cmds {
			sp.Steps = append(sp.Steps, client.TemplateStep{Run: cmd})
		}
		return sp
	}
	b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "keep", Spec: spec("echo kept > /kept")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if end, err := c.FollowBuild(ctx, "keep", b.ID, nil); err != nil || end.State != client.BuildStateSucceeded {
		t.Fatalf("build keep: %+v %v", end, err)
	}
	// twoSteps's second step runs on an overlay mount of the first's layer.
	twoSteps := spec("echo a > /a", "sleep 8; echo two > /two")
	oneStep := spec("sleep 8; echo one > /one")
	stepRuns := func(s *server, buildID string, step int) func() bool {
		sbID := strings.ReplaceAll(buildID, "_", "-") + "-" + strconv.Itoa(step)
		return func() bool { return len(hostLeftovers(s, sbID)) > 0 }
	}
	points := []struct {
		name string
		spec client.TemplateSpec
		// wait returns once the kill point is reached.
		wait func(s *server, buildID string)
	}{
		{"second step running", twoSteps, func(s *server, id string) {
			runs := stepRuns(s, id, 2)
			for deadline := time.Now().Add(time.Minute); !runs(); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the second step never started")
				}
			}
			if mi, _ := os.ReadFile("/proc/self/mountinfo"); !strings.Contains(string(mi), filepath.Join(dir, "images", "tmp")) {
				t.Fatal("no overlay mount while the second step runs")
			}
		}},
		{"first step running", oneStep, func(s *server, id string) {
			runs := stepRuns(s, id, 1)
			for deadline := time.Now().Add(time.Minute); !runs(); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the first step never started")
				}
			}
		}},
		{"random moment", twoSteps, func(*server, string) {
			time.Sleep(time.Duration(rng.Int64N(int64(1500 * time.Millisecond))))
		}},
	}
	s := s1
	killed := false // s was killed and not restarted
	defer func() {
		if !killed {
			if err := s.stop(); err != nil {
				t.Error(err)
			}
		}
	}()
	for round, p := range points {
		c = s.admin
		slow, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "interrupted", Spec: p.spec}, nil)
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		p.wait(s, slow.ID)
		at := time.Since(began)
		state := "?"
		if cur, err := c.GetBuild(ctx, "interrupted", slow.ID); err == nil {
			state = cur.State
		}
		killed = true
		killHard(t, s, round)
		t.Logf("round %d: killed (%s) at %s, %v after the build was asked for, while it was %s",
			round, map[bool]string{true: "server alone", false: "process group"}[round%2 == 0], p.name, at.Round(time.Millisecond), state)
		restarted, err := startServer(serverOptions{dataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		s, killed = restarted, false
		c = s.admin
		end, err := c.GetBuild(ctx, "interrupted", slow.ID)
		if state == client.BuildStateSucceeded {
			// The random moment came after the build's end.
			if err != nil || end.State != client.BuildStateSucceeded {
				t.Errorf("round %d: a finished build after the restart: %+v %v", round, end, err)
			}
			if err := c.DeleteTemplate(ctx, "interrupted"); err != nil {
				t.Fatal(err)
			}
		} else {
			if err != nil || end.State != client.BuildStateFailed || !strings.Contains(end.Error, "server stopped") || !strings.Contains(end.Error, "restarted") {
				t.Errorf("round %d: interrupted build after the restart: %+v %v", round, end, err)
			}
			if _, err := c.GetTemplate(ctx, "interrupted"); !client.IsNotFound(err) {
				t.Errorf("round %d: template of the interrupted build: %v", round, err)
			}
		}
		for step := 1; step <= len(p.spec.Steps); step++ {
			assertGone(t, s, strings.ReplaceAll(slow.ID, "_", "-")+"-"+strconv.Itoa(step))
		}
		if entries, _ := os.ReadDir(filepath.Join(dir, "images", "tmp")); len(entries) > 0 {
			t.Errorf("round %d: work dirs left: %v", round, entries)
		}
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		if strings.Contains(string(mi), filepath.Join(dir, "images")) {
			t.Errorf("round %d: mounts left under %s", round, filepath.Join(dir, "images"))
		}
		// Every stored template is whole: its rootfs and its metadata.
		tdirs, _ := os.ReadDir(filepath.Join(dir, "images", "templates"))
		for _, d := range tdirs {
			for _, f := range []string{"rootfs", "template.json"} {
				if _, err := os.Stat(filepath.Join(dir, "images", "templates", d.Name(), f)); err != nil {
					t.Errorf("round %d: stored template %s is not whole: %v", round, d.Name(), err)
				}
			}
		}
		if left, _ := waitSwept(s, 30*time.Second); len(left) > 0 {
			t.Errorf("round %d: left on the host after the restart:\n  %s", round, strings.Join(left, "\n  "))
		}
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "keep", Runtime: client.RuntimeNamespaces})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "cat /kept"}); err != nil || res.Stdout != "kept\n" {
			t.Errorf("round %d: template after the restart: %+v %v", round, res, err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		assertGone(t, s, sb.ID)
	}
	// The same spec builds, and the template works.
	again, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "interrupted", Spec: twoSteps}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if end, err := c.FollowBuild(ctx, "interrupted", again.ID, nil); err != nil || end.State != client.BuildStateSucceeded {
		t.Fatalf("the interrupted spec built again: %+v %v", end, err)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "interrupted", Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.DeleteSandbox(context.Background(), sb.ID)
		assertGone(t, s, sb.ID)
	}()
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "cat /a /two"}); err != nil || res.Stdout != "a\ntwo\n" {
		t.Errorf("template built after the restarts: %+v %v", res, err)
	}
}

// serverSpec: a copy step's owner and mode, and a start command with the
// check that it is up.
const serverSpec = `
from: python
steps:
  - run: useradd -m app
  - copy: {src: data, dst: /srv/data, owner: app, mode: "0750"}
  - copy: {src: data/a.txt, dst: /srv/plain.txt}
start_cmd: python3 -m http.server 8000 --directory /srv
ready_cmd: timeout 30 sh -c 'until python3 -c "import socket; socket.create_connection((\"127.0.0.1\", 8000))" 2>/dev/null; do sleep 0.1; done'
`

// TestTemplateOwnerModeStartCmd: a copy step's owner and mode on what it
// copied (not the directories above); a start command running in every
// sandbox on both runtimes, checked at the end of the build and before
// each sandbox is handed out; kept by a template built from it; and a
// start command whose check fails fails the build.
func TestTemplateOwnerModeStartCmd(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 8})
	dir := writeContextDir(t)
	deleteTemplateAtEnd(t, c, "with-server")
	b, log := buildAndWait(t, c, "with-server", mustParse(t, serverSpec), contextTar(t, dir, "data"))
	if b.State != client.BuildStateSucceeded {
		t.Fatalf("build: %+v\n%s", b, log)
	}
	for _, want := range []string{`(owner "app", mode "0750")`, "start_cmd python3 -m http.server"} {
		if !strings.Contains(log, want) {
			t.Errorf("build log lacks %q:\n%s", want, log)
		}
	}
	tm, err := c.GetTemplate(ctxT(t, time.Minute), "with-server")
	if err != nil || tm.StartCmd != "python3 -m http.server 8000 --directory /srv" || tm.ReadyCmd == "" {
		t.Fatalf("template: %+v, %v", tm, err)
	}
	deleteTemplateAtEnd(t, c, "with-server-child")
	child, log := buildAndWait(t, c, "with-server-child", mustParse(t, "from: with-server\nsteps:\n  - run: echo child > /srv/child.txt\n"), nil)
	if child.State != client.BuildStateSucceeded {
		t.Fatalf("child build: %+v\n%s", child, log)
	}
	fetch := `python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/%s').read().decode().strip())"`
	for _, rt := range runtimes {
		sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "with-server", Runtime: rt})
		res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "stat -c '%n %a %U:%G' /srv /srv/data /srv/data/a.txt /srv/data/sub /srv/data/sub/b.txt /srv/plain.txt && " +
			fmt.Sprintf(fetch, "data/a.txt")})
		want := "/srv 755 root:root\n/srv/data 750 app:app\n/srv/data/a.txt 750 app:app\n/srv/data/sub 750 app:app\n/srv/data/sub/b.txt 750 app:app\n/srv/plain.txt 644 root:root\nalpha\n"
		if res.ExitCode != 0 || res.Stdout != want {
			t.Errorf("%s: %q (stderr %q), want %q", rt, res.Stdout, res.Stderr, want)
		}
		procs, err := c.ListProcesses(ctxT(t, time.Minute), sb.ID)
		if err != nil || !slices.ContainsFunc(procs, func(p client.Process) bool { return p.Tag == "start-cmd" && p.Running }) {
			t.Errorf("%s: the start command's process: %+v, %v", rt, procs, err)
		}
		sb = mustCreate(t, c, client.CreateSandboxRequest{Template: "with-server-child", Runtime: rt})
		if res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: fmt.Sprintf(fetch, "child.txt")}); res.Stdout != "child\n" {
			t.Errorf("%s: the child template's server: %q %q", rt, res.Stdout, res.Stderr)
		}
	}

	// A start command that never answers its check: the build fails at
	// the check, and no template is kept.
	bad, log := buildAndWait(t, c, "with-dead-server", mustParse(t, "from: python\nstart_cmd: exit 1\nready_cmd: python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000))\"\n"), nil)
	if bad.State != client.BuildStateFailed || !strings.Contains(bad.Error, "ready_cmd") {
		t.Errorf("a dead start command: %+v\n%s", bad, log)
	}
	if _, err := c.GetTemplate(ctxT(t, time.Minute), "with-dead-server"); !client.IsNotFound(err) {
		t.Errorf("the failed build's template: %v", err)
	}
}
