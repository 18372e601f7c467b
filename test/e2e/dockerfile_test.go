package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestDockerfileBuild: `evalbox template build -f Dockerfile` builds a
// Dockerfile on the server, as a Harbor task's environment/Dockerfile is
// written: ARG (a --build-arg over its default), ENV expanding the base's
// PATH, WORKDIR, COPY --chown of context files, RUN in both forms, USER,
// CMD recorded. A sandbox of it has all of that; a second build of the
// same Dockerfile takes every step from the cache; bad Dockerfiles exit
// non-zero with one line that names the line, and make nothing.
func TestDockerfileBuild(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 4})
	ctx := ctxT(t, 8*time.Minute)
	const tpl = "dockerfile-task"
	deleteTemplateAtEnd(t, c, tpl)
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Dockerfile", `FROM python
ARG GREETING=hello
ARG LEVEL=1
ENV APP=/app PATH=/app/bin:$PATH
WORKDIR $APP
COPY --chown=nobody:nogroup task/ ./task/
COPY bin/tool /app/bin/tool
RUN chmod 755 /app/bin/tool && echo "$GREETING level $LEVEL" > /app/built.txt
RUN ["python3", "-c", "open('/app/exec-form.txt', 'w').write('ok')"]
USER nobody
CMD ["python3", "-m", "http.server", "8000"]
`)
	write("task/input.txt", "the task\n")
	write("bin/tool", "#!/bin/sh\necho tool ran\n")
	write("unused.txt", "not uploaded\n")

	_, stderr, code := runCLI(t, ctx, key, "", "template", "build", "-f", filepath.Join(dir, "Dockerfile"), "--name", tpl, "--build-arg", "LEVEL=2", dir)
	if code != 0 {
		t.Fatalf("build: exit %d\n%s", code, stderr)
	}
	got, err := c.GetTemplate(ctx, tpl)
	if err != nil {
		t.Fatal(err)
	}
	if got.User != "nobody" || got.Workdir != "/app" || !strings.HasPrefix(got.Env["PATH"], "/app/bin:/usr/local/") ||
		!slices.Equal(got.Cmd, []string{"python3", "-m", "http.server", "8000"}) {
		t.Errorf("template %+v", got)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: tpl, Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSandbox(context.Background(), sb.ID)
	r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
		`id -un; pwd; cat built.txt exec-form.txt; echo; stat -c %U:%G task/input.txt; tool; echo "[$GREETING]"; ls /app/unused.txt 2>&1 | head -c 0`}})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("%+v %v", r, err)
	}
	// ARGs are the build's, not the image's.
	if want := "nobody\n/app\nhello level 2\nok\nnobody:nogroup\ntool ran\n[]\n"; r.Stdout != want {
		t.Errorf("in the sandbox:\n%s\nwant\n%s", r.Stdout, want)
	}

	// The same Dockerfile again: every step from the cache.
	b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: tpl + "-again", Dockerfile: mustRead(t, filepath.Join(dir, "Dockerfile")),
		BuildArgs: map[string]string{"LEVEL": "2"}}, contextTar(t, dir, "task", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, c, tpl+"-again")
	end, err := c.FollowBuild(ctx, tpl+"-again", b.ID, nil)
	if err != nil || end.State != client.BuildStateSucceeded || end.BuiltSteps != 0 || end.Digest != got.Digest {
		t.Errorf("again: %+v %v (first digest %s)", end, err, got.Digest)
	}

	// Bad Dockerfiles: one line naming the line, exit non-zero, nothing made.
	for df, want := range map[string]string{
		"FROM python\nVOLUME /data\n":                  "line 2 (VOLUME)",
		"FROM python AS a\nFROM a\n":                   "line 2: a second FROM",
		"FROM no-such-image:1.0\nRUN true\n":           "line 1: FROM no-such-image:1.0",
		"FROM python\nCOPY --from=builder /a /b\n":     "line 2 (COPY): COPY --from",
		"FROM python\nADD https://example.test/x /x\n": "ADD of a URL",
	} {
		write("bad/Dockerfile", df)
		stdout, stderr, code := runCLI(t, ctx, key, "", "template", "build", "-f", filepath.Join(dir, "bad", "Dockerfile"), "--name", "dockerfile-bad")
		if code == 0 || stdout != "" || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, want) {
			t.Errorf("%q: exit %d %q %q", df, code, stdout, stderr)
		}
	}
	// The server refuses them too (a client that does not parse them).
	if _, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "dockerfile-bad", Dockerfile: "FROM python\nHEALTHCHECK CMD true\n"}, nil); client.ErrorCode(err) != client.CodeBadRequest ||
		!strings.Contains(err.Error(), "line 2 (HEALTHCHECK)") {
		t.Errorf("server: %v", err)
	}
	if _, err := c.GetTemplate(ctx, "dockerfile-bad"); !client.IsNotFound(err) {
		t.Errorf("a refused build made a template: %v", err)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
