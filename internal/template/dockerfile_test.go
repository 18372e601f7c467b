package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestDockerfile: each instruction evalbox builds, as the build spec it
// becomes, with ARGs (defaults, build args, globals before FROM) and ENV
// expanded as Docker expands them.
func TestDockerfile(t *testing.T) {
	df := `# syntax=docker/dockerfile:1
ARG BASE=python
FROM ${BASE}
ARG BASE
ARG VERSION=1.0
ARG DEBIAN_FRONTEND=noninteractive
LABEL org.example=x
EXPOSE 8000
ENV APP_HOME=/srv/app PATH="/srv/app/bin:$PATH"
WORKDIR $APP_HOME
RUN apt-get update && \
    apt-get install -y curl
RUN ["python3", "-c", "print('it''s')"]
COPY --chown=nobody:nogroup --chmod=0640 requirements.txt setup.cfg ./
COPY src /srv/app/src
ADD data/ data
WORKDIR sub
USER nobody
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN echo v$VERSION | cat
CMD python3 -m http.server
ENTRYPOINT ["/entry.sh"]
`
	d, err := ParseDockerfile([]byte(df), map[string]string{"VERSION": "2.5"})
	if err != nil {
		t.Fatal(err)
	}
	if d.From != "python" || d.FromLine != 3 {
		t.Errorf("FROM %q line %d", d.From, d.FromLine)
	}
	spec, err := d.Spec(client.Template{Name: "python", User: "root", Workdir: "/", Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	exports := "export BASE=python\nexport DEBIAN_FRONTEND=noninteractive\nexport VERSION=2.5\n" // ARGs, sorted
	want := []client.TemplateStep{
		{Env: map[string]string{"APP_HOME": "/srv/app", "PATH": "/srv/app/bin:/usr/bin:/bin"}},
		{Workdir: "/srv/app"},
		{Run: exports + "apt-get update &&     apt-get install -y curl"},
		{Run: exports + `python3 -c 'print('\''it'\'''\''s'\'')'`},
		{Copy: &client.CopyStep{Src: "requirements.txt", Dst: "./", Owner: "nobody:nogroup", Mode: "0640"}},
		{Copy: &client.CopyStep{Src: "setup.cfg", Dst: "./", Owner: "nobody:nogroup", Mode: "0640"}},
		{Copy: &client.CopyStep{Src: "src", Dst: "/srv/app/src"}},
		{Copy: &client.CopyStep{Src: "data", Dst: "data"}},
		{Workdir: "/srv/app/sub"},
		{User: "nobody"},
		{Run: exports + `/bin/bash -o pipefail -c 'echo v$VERSION | cat'`},
	}
	got, _ := json.MarshalIndent(spec.Steps, "", " ")
	exp, _ := json.MarshalIndent(want, "", " ")
	if string(got) != string(exp) || spec.From != "python" {
		g, e := strings.Split(string(got), "\n"), strings.Split(string(exp), "\n")
		for i := range min(len(g), len(e)) {
			if g[i] != e[i] {
				t.Errorf("steps differ at line %d: %s, want %s", i, g[i], e[i])
				break
			}
		}
	}
	if !slices.Equal(d.Cmd, []string{"/bin/bash", "-o", "pipefail", "-c", "python3 -m http.server"}) || !slices.Equal(d.Entrypoint, []string{"/entry.sh"}) {
		t.Errorf("CMD %q ENTRYPOINT %q", d.Cmd, d.Entrypoint)
	}
}

// TestDockerfileExpansionOrder: an unset variable expands empty, as in
// Docker; a later ENV sees an earlier one, and WORKDIR sees both.
func TestDockerfileExpansionOrder(t *testing.T) {
	d, err := ParseDockerfile([]byte("FROM base\nENV A=1\nENV B=${A}2 C=$UNSET.x\nWORKDIR /w/$B\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := d.Spec(client.Template{Name: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if spec.Steps[1].Env["B"] != "12" || spec.Steps[1].Env["C"] != ".x" || spec.Steps[2].Workdir != "/w/12" {
		t.Errorf("steps %+v", spec.Steps)
	}
}

// TestDockerfileRefused: what evalbox does not build is an error that
// names the instruction and its line; so is a Dockerfile that does not
// parse.
func TestDockerfileRefused(t *testing.T) {
	for df, want := range map[string]string{
		"":                                       "no instructions",
		"RUN true\n":                             "no build stage",
		"FROM python AS a\nFROM a\n":             "line 2: a second FROM",
		"FROM --platform=linux/arm64 python\n":   "line 1: FROM --platform",
		"FROM scratch\n":                         "FROM scratch",
		"FROM python\n\nVOLUME /data\n":          "line 3 (VOLUME): evalbox does not build this instruction",
		"FROM python\nHEALTHCHECK CMD true\n":    "line 2 (HEALTHCHECK)",
		"FROM python\nONBUILD RUN true\n":        "line 2 (ONBUILD)",
		"FROM python\nSTOPSIGNAL SIGTERM\n":      "line 2 (STOPSIGNAL)",
		"FROM python\nRUN --network=none true\n": "line 2 (RUN): RUN --network",
		"FROM python\nCOPY --from=x /a /b\n":     "line 2 (COPY): COPY --from",
		"FROM python\nCOPY *.py /app/\n":         "is a pattern",
		"FROM python\nCOPY a b /app\n":           "must be a directory ending with /",
		"FROM python\nADD https://x.test/f /f\n": "ADD of a URL",
		"FROM python\nADD dist.tar.gz /opt/\n":   "ADD of an archive",
		"FROM python\nRUN <<EOF\necho hi\nEOF\n": "here-document",
		"FROM python\nWORKDIR\n":                 "line 2",
		"FROM python\nFOO bar\n":                 "unknown instruction",
	} {
		d, err := ParseDockerfile([]byte(df), nil)
		if err == nil {
			_, err = d.Spec(client.Template{Name: "python"})
		}
		var se *SpecError
		if err == nil || !errors.As(err, &se) || !strings.Contains(err.Error(), want) {
			t.Errorf("%.80q: %.200v, want a SpecError with %q", df, err, want)
		}
	}
}

// TestDockerfileSemantics: ARG defaults that name earlier ARGs, an ARG
// without a value left unset (not exported empty), Docker's own platform
// ARGs, the escape directive.
func TestDockerfileSemantics(t *testing.T) {
	df := "# escape=`\nARG V=3\nARG IMG=py${V}\nFROM ${IMG}\nARG HOME\nARG TARGETARCH\nENV LIT=`$B ARCH=$TARGETARCH\nRUN true\n"
	d, err := ParseDockerfile([]byte(df), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.From != "py3" {
		t.Errorf("FROM %q, want py3", d.From)
	}
	spec, err := d.Spec(client.Template{Name: "py3"})
	if err != nil {
		t.Fatal(err)
	}
	if env := spec.Steps[0].Env; env["LIT"] != "$B" || env["ARCH"] != runtime.GOARCH {
		t.Errorf("ENV %v", env)
	}
	if run := spec.Steps[1].Run; run != "export TARGETARCH="+runtime.GOARCH+"\ntrue" {
		t.Errorf("RUN %q: HOME must stay unset", run)
	}
}

// TestDockerfileBounds: a Dockerfile of a few hundred bytes cannot make
// the server expand gigabytes, nor thousands of ARGs into every RUN: each
// is refused as it goes.
func TestDockerfileBounds(t *testing.T) {
	doubling := "FROM python\nENV A=xxxxxxxx\n" + strings.Repeat("ENV A=$A$A\n", 40)
	manyArgs := "FROM python\n"
	for i := range 300 {
		manyArgs += fmt.Sprintf("ARG A%d=%s\n", i, strings.Repeat("v", 300))
	}
	manyArgs += strings.Repeat("RUN true\n", 50)
	labels := "FROM python\nARG A=xxxxxxxxxxxxxxxx\n" + strings.Repeat("ARG A=$A$A$A$A\n", 30) + "LABEL x=$A\n"
	for name, df := range map[string]string{"doubling": doubling, "args": manyArgs, "labels": labels,
		"steps": "FROM python\n" + strings.Repeat("RUN true\n", MaxSteps+1), "instructions": "FROM python\n" + strings.Repeat("EXPOSE 1\n", maxInstructions+1)} {
		d, err := ParseDockerfile([]byte(df), nil)
		if err == nil {
			_, err = d.Spec(client.Template{Name: "python"})
		}
		var se *SpecError
		if !errors.As(err, &se) {
			t.Errorf("%s: %v, want a SpecError", name, err)
		}
	}
}
