package template

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"path"
	"runtime"
	"slices"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/evalbox/evalbox/pkg/client"
)

// The Dockerfile front end: a Dockerfile read (by BuildKit's own parser)
// into a build spec. One stage; FROM names a template or an imported
// image (the caller resolves it, then Spec translates the rest from that
// template's user and working directory); RUN, ENV, ARG, WORKDIR, USER,
// COPY and ADD of local files (--chown, --chmod) and SHELL become steps;
// CMD and ENTRYPOINT are recorded; LABEL, EXPOSE and MAINTAINER are
// metadata evalbox has no use for. Anything else is refused with its line.

// MaxDockerfileBytes bounds a Dockerfile's text.
const MaxDockerfileBytes = 1 << 20

// Dockerfile is a parsed Dockerfile, waiting for its base (Spec).
type Dockerfile struct {
	// From is the FROM reference, its ARGs expanded; FromLine its line.
	From     string
	FromLine int
	// Cmd and Entrypoint are the last CMD and ENTRYPOINT, in exec form
	// (a shell form is the shell's argv), recorded, not run.
	Cmd, Entrypoint []string
	stage           instructions.Stage
	metaArgs        map[string]string // the ARGs before FROM, with the build args
	buildArgs       map[string]string
	escape          rune // the escape directive's token (default \\)
}

// Bounds of a Dockerfile's translation, applied as it goes (a few lines can
// otherwise expand to gigabytes: ENV A=$A$A, doubling on every line).
const (
	maxExpanded     = 64 << 10 // one word, expanded
	maxArgs         = 256      // ARGs in scope
	maxInstructions = 1000
)

// platformArgs are the ARGs Docker fills in itself (for this host: evalbox
// builds for the platform it runs on).
var platformArgs = map[string]string{
	"TARGETPLATFORM": "linux/" + runtime.GOARCH, "TARGETOS": "linux", "TARGETARCH": runtime.GOARCH, "TARGETVARIANT": "",
	"BUILDPLATFORM": "linux/" + runtime.GOARCH, "BUILDOS": "linux", "BUILDARCH": runtime.GOARCH, "BUILDVARIANT": "",
}

// ParseDockerfile reads a Dockerfile; buildArgs override its ARG defaults
// (as docker build --build-arg). Its errors are *SpecError naming the line.
func ParseDockerfile(b []byte, buildArgs map[string]string) (*Dockerfile, error) {
	if len(b) > MaxDockerfileBytes {
		return nil, specErrorf("the Dockerfile is larger than %d bytes", MaxDockerfileBytes)
	}
	res, err := parser.Parse(bytes.NewReader(b))
	if err != nil {
		return nil, specErrorf("Dockerfile: %v", err)
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return nil, specErrorf("Dockerfile: %v", err)
	}
	switch {
	case len(stages) == 0:
		return nil, specErrorf("Dockerfile: no FROM")
	case len(stages) > 1:
		return nil, specErrorf("Dockerfile line %d: a second FROM: evalbox builds one stage (multi-stage builds are not supported)", line(stages[1].Location))
	}
	st := stages[0]
	if len(st.Commands) > maxInstructions {
		return nil, specErrorf("Dockerfile: more than %d instructions", maxInstructions)
	}
	d := &Dockerfile{stage: st, FromLine: line(st.Location), metaArgs: maps.Clone(platformArgs), buildArgs: buildArgs, escape: res.EscapeToken}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			switch v, ok := buildArgs[kv.Key]; {
			case ok:
				d.metaArgs[kv.Key] = v
			case kv.Value != nil:
				// A default may name the ARGs before it.
				v, err := d.expand(*kv.Value, d.metaArgs)
				if err != nil {
					return nil, specErrorf("Dockerfile line %d (ARG %s): %v", line(a.Location()), kv.Key, err)
				}
				d.metaArgs[kv.Key] = v
			}
		}
	}
	if st.Platform != "" {
		return nil, specErrorf("Dockerfile line %d: FROM --platform is not supported", d.FromLine)
	}
	from, err := d.expand(st.BaseName, d.metaArgs)
	if err != nil || from == "" {
		return nil, specErrorf("Dockerfile line %d: FROM %q: %v", d.FromLine, st.BaseName, err)
	}
	if from == "scratch" {
		return nil, specErrorf("Dockerfile line %d: FROM scratch: start from a template or an imported image", d.FromLine)
	}
	d.From = from
	return d, nil
}

// Spec translates the Dockerfile onto from, the template its FROM named
// (its name, user, working directory and environment, which ENV's
// references such as $PATH expand from). The steps use the template's
// name as From; the spec is checked with ValidateSpec.
func (d *Dockerfile) Spec(from client.Template) (client.TemplateSpec, error) {
	spec := client.TemplateSpec{From: from.Name}
	user, workdir := cmp.Or(from.User, "root"), cmp.Or(from.Workdir, "/")
	env := maps.Clone(from.Env) // for expansion: the base's environment, then each ENV
	if env == nil {
		env = map[string]string{}
	}
	args := map[string]string{} // ARGs in scope
	sh := []string{"/bin/sh", "-c"}
	vars := func() map[string]string {
		m := maps.Clone(args)
		maps.Copy(m, env)
		return m
	}
	for _, c := range d.stage.Commands {
		ln := line(c.Location())
		bad := func(format string, a ...any) error {
			return specErrorf("Dockerfile line %d (%s): %s", ln, strings.ToUpper(c.Name()), fmt.Sprintf(format, a...))
		}
		if ex, ok := c.(instructions.SupportsSingleWordExpansion); ok {
			if _, isRun := c.(*instructions.RunCommand); !isRun {
				vs := vars()
				if err := ex.Expand(func(w string) (string, error) { return d.expand(w, vs) }); err != nil {
					return spec, bad("%v", err)
				}
			}
		}
		switch c := c.(type) {
		case *instructions.ArgCommand:
			for _, kv := range c.Args {
				switch v, ok := d.buildArgs[kv.Key]; {
				case ok:
					args[kv.Key] = v
				case kv.Value != nil:
					args[kv.Key] = *kv.Value
				default:
					// ARG NAME after FROM takes the global's value, or
					// Docker's own (TARGETARCH, …); else it stays unset.
					if mv, ok := d.metaArgs[kv.Key]; ok {
						args[kv.Key] = mv
					}
				}
			}
			total := 0
			for k, v := range args {
				total += len(k) + len(v)
			}
			// Every RUN gets them all: they must fit in one.
			if len(args) > maxArgs || total > maxRunBytes {
				return spec, bad("more than %d ARGs, or more than %d bytes of them", maxArgs, maxRunBytes)
			}
		case *instructions.EnvCommand:
			step := map[string]string{}
			for _, kv := range c.Env {
				step[kv.Key] = kv.Value
				env[kv.Key] = kv.Value
			}
			if len(env) > maxEnvVars {
				return spec, bad("more than %d environment variables", maxEnvVars)
			}
			spec.Steps = append(spec.Steps, client.TemplateStep{Env: step})
		case *instructions.RunCommand:
			if len(c.FlagsUsed) > 0 {
				return spec, bad("RUN --%s is not supported", c.FlagsUsed[0])
			}
			if len(c.Files) > 0 {
				return spec, bad("RUN with a here-document is not supported")
			}
			if len(c.CmdLine) == 0 || strings.TrimSpace(strings.Join(c.CmdLine, "")) == "" {
				return spec, bad("want a command")
			}
			run := runLine(args, env, sh, c.ShellDependantCmdLine)
			if len(run) > maxRunBytes {
				return spec, bad("the command, with its ARGs, is longer than %d bytes", maxRunBytes)
			}
			spec.Steps = append(spec.Steps, client.TemplateStep{Run: run})
		case *instructions.WorkdirCommand:
			w := c.Path
			if !path.IsAbs(w) {
				w = path.Join(workdir, w)
			}
			workdir = path.Clean(w)
			spec.Steps = append(spec.Steps, client.TemplateStep{Workdir: workdir})
		case *instructions.UserCommand:
			if c.User == "" {
				return spec, bad("want a user")
			}
			user = c.User
			spec.Steps = append(spec.Steps, client.TemplateStep{User: user})
		case *instructions.CopyCommand:
			if c.From != "" {
				return spec, bad("COPY --from is not supported (one stage, no images pulled)")
			}
			if c.Link || c.Parents || len(c.ExcludePatterns) > 0 {
				return spec, bad("COPY --link, --parents and --exclude are not supported")
			}
			steps, err := copySteps(c.SourcesAndDest, c.Chown, c.Chmod)
			if err != nil {
				return spec, bad("%v", err)
			}
			spec.Steps = append(spec.Steps, steps...)
		case *instructions.AddCommand:
			if c.Link || len(c.ExcludePatterns) > 0 || c.Checksum != "" || c.KeepGitDir != nil || c.Unpack != nil {
				return spec, bad("ADD --link, --exclude, --checksum, --keep-git-dir and --unpack are not supported")
			}
			for _, s := range c.SourcePaths {
				if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
					return spec, bad("ADD of a URL (%s) is not supported: evalbox fetches nothing at build time but through RUN", s)
				}
				if isArchiveName(s) {
					return spec, bad("ADD of an archive (%s) would unpack it, which evalbox does not: COPY it and RUN tar", s)
				}
			}
			steps, err := copySteps(c.SourcesAndDest, c.Chown, c.Chmod)
			if err != nil {
				return spec, bad("%v", err)
			}
			spec.Steps = append(spec.Steps, steps...)
		case *instructions.ShellCommand:
			if len(c.Shell) == 0 {
				return spec, bad("want a shell")
			}
			sh = slices.Clone(c.Shell)
		case *instructions.CmdCommand:
			d.Cmd = cmdLine(c.ShellDependantCmdLine, sh)
		case *instructions.EntrypointCommand:
			d.Entrypoint = cmdLine(c.ShellDependantCmdLine, sh)
		case *instructions.LabelCommand, *instructions.ExposeCommand, *instructions.MaintainerCommand:
			// Metadata: nothing to build.
		default:
			return spec, bad("evalbox does not build this instruction (it builds RUN, ENV, ARG, WORKDIR, USER, COPY, ADD, SHELL, CMD, ENTRYPOINT, LABEL, EXPOSE)")
		}
		if len(spec.Steps) > MaxSteps {
			return spec, bad("more than %d steps", MaxSteps)
		}
	}
	if err := ValidateSpec(spec); err != nil {
		return spec, err
	}
	return spec, nil
}

// copySteps are a COPY's or ADD's sources as copy steps: several sources
// go into the destination directory (which must then end with /).
func copySteps(sd instructions.SourcesAndDest, chown, chmod string) ([]client.TemplateStep, error) {
	if len(sd.SourceContents) > 0 {
		return nil, fmt.Errorf("a here-document source is not supported")
	}
	dst := sd.DestPath
	if len(sd.SourcePaths) > 1 && !strings.HasSuffix(dst, "/") {
		return nil, fmt.Errorf("with several sources the destination %q must be a directory ending with /", dst)
	}
	var steps []client.TemplateStep
	for _, src := range sd.SourcePaths {
		if strings.ContainsAny(src, "*?[") {
			return nil, fmt.Errorf("the source %q is a pattern: name files or directories of the build context", src)
		}
		clean := path.Clean("/" + src)[1:]
		if clean == "" {
			clean = "."
		}
		steps = append(steps, client.TemplateStep{Copy: &client.CopyStep{Src: clean, Dst: dst, Owner: chown, Mode: chmod}})
	}
	return steps, nil
}

// runLine is the shell command (for /bin/sh -c) of a RUN: its shell form
// as it is under the default shell, else its argv quoted; the ARGs in
// scope exported first (Docker gives them to RUN and keeps them out of the
// image; an ENV of the same name wins, as in Docker).
func runLine(args, env map[string]string, sh []string, c instructions.ShellDependantCmdLine) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(args)) {
		if _, ok := env[k]; !ok && validEnvName(k) {
			b.WriteString("export " + k + "=" + shellQuote(args[k]) + "\n")
		}
	}
	if c.PrependShell && slices.Equal(sh, []string{"/bin/sh", "-c"}) {
		b.WriteString(strings.Join(c.CmdLine, " "))
		return b.String()
	}
	for i, a := range cmdLine(c, sh) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(shellQuote(a))
	}
	return b.String()
}

func cmdLine(c instructions.ShellDependantCmdLine, sh []string) []string {
	if c.PrependShell {
		return append(slices.Clone(sh), strings.Join(c.CmdLine, " "))
	}
	return slices.Clone(c.CmdLine)
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == '/' || r == '=' || r == ':' || r == ',' || r == '@' || r == '+' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func validEnvName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	return strings.IndexFunc(k, func(r rune) bool {
		return !(r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0
}

func isArchiveName(s string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"} {
		if strings.HasSuffix(strings.ToLower(s), ext) {
			return true
		}
	}
	return false
}

// expand substitutes $VAR and ${VAR…} in word as a Dockerfile does (with
// its escape token), refusing a result past maxExpanded.
func (d *Dockerfile) expand(word string, vars map[string]string) (string, error) {
	esc := d.escape
	if esc == 0 {
		esc = '\\'
	}
	out, _, err := shell.NewLex(esc).ProcessWord(word, mapEnv(vars))
	if err == nil && len(out) > maxExpanded {
		err = fmt.Errorf("a word expands to more than %d bytes", maxExpanded)
	}
	return out, err
}

func line(r []parser.Range) int {
	if len(r) == 0 {
		return 0
	}
	return r[0].Start.Line
}

// mapEnv is a map as the lexer's environment (read in place, not copied).
type mapEnv map[string]string

func (m mapEnv) Get(k string) (string, bool) {
	v, ok := m[k]
	return v, ok
}

func (m mapEnv) Keys() []string { return slices.Collect(maps.Keys(m)) }
