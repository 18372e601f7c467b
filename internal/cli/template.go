package cli

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

func newTemplateCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "Build, import, list and delete templates",
	})
	cmd.AddCommand(newTemplateLsCmd(a), newTemplateGetCmd(a), newTemplateBuildCmd(a), newTemplateImportCmd(a),
		newTemplateLogsCmd(a), newTemplateRmCmd(a), newTemplateTagsCmd(a), newTemplateTagCmd(a), newTemplateInitCmd())
	return cmd
}

func newTemplateLsCmd(a *app) *cobra.Command {
	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the templates sandboxes can be created from, and the store's disk usage",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := a.client().ListTemplatesUsage(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if l.Templates == nil {
					l.Templates = []client.Template{}
				}
				return printJSON(out(cmd), l)
			}
			t := newTable(out(cmd), "NAME", "SOURCE", "DIGEST", "SIZE", "CPU", "MEMORY_MB", "DISK_MB", "BUILT")
			for _, tm := range l.Templates {
				t.row(tm.Name, orDash(tm.Source), shortDigest(tm.Digest), humanBytes(tm.SizeBytes), strconv.FormatFloat(tm.CPU, 'g', -1, 64),
					strconv.Itoa(tm.MemoryMB), strconv.Itoa(tm.DiskMB), timeCell(tm.BuiltAt))
			}
			if err := t.flush(); err != nil {
				return err
			}
			_, err = fmt.Fprintf(out(cmd), "\ntemplate store: %s on disk\n", humanBytes(l.DiskUsageBytes))
			return err
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return ls
}

func newTemplateGetCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show a template (JSON)",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			t, err := a.client().GetTemplate(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			return printJSON(out(cmd), t)
		},
	}
}

func newTemplateRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME[:TAG]...",
		Aliases: []string{"delete"},
		Short:   "Delete templates with their tags, or one tag (refused while running sandboxes use them)",
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, names []string) error {
			c := a.client()
			for _, n := range names {
				if err := c.DeleteTemplate(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func newTemplateTagsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "tags NAME",
		Short: "List a template's tags (default is the untagged name)",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			l, err := a.client().TemplateTags(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), l)
			}
			t := newTable(out(cmd), "TAG", "BUILD", "DIGEST", "SINCE")
			for _, tg := range l.Tags {
				t.row(tg.Tag, orDash(tg.BuildID), shortDigest(tg.Digest), timeCell(tg.CreatedAt))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the tags as JSON")
	return cmd
}

func newTemplateTagCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "tag NAME TARGET TAG...",
		Short: "Point tags of a template at what TARGET (a tag of it, or a build id) names",
		Example: `  evalbox template tag my-task v2 stable      # my-task:stable is my-task:v2's build
  evalbox template tag my-task bld_… default  # the untagged name goes back to that build`,
		Args: args(cobra.MinimumNArgs(3)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			_, err := a.client().TagTemplate(cmd.Context(), argv[0], argv[1], argv[2:]...)
			return err
		},
	}
}

func newTemplateBuildCmd(a *app) *cobra.Command {
	var (
		specFile, name  string
		tags, buildArgs []string
		detach, asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "build -f SPEC --name NAME [CONTEXT_DIR]",
		Short: "Build a template from a build spec; streams the build log",
		Long: `Build a template from a build spec (YAML or JSON):

  from: python                  # a built-in (base, python, node, polyglot, …) or one of your templates
  steps:
    - run: pip install numpy    # /bin/sh -c, in a build sandbox; one cached layer per step
    - env: {MODE: eval}
    - copy: {src: harness, dst: /opt/harness}   # from CONTEXT_DIR
    - workdir: /opt/harness
    - user: nobody
  memory_mb: 1024               # defaults of the template's sandboxes (also cpu, disk_mb)
  ready_cmd: python3 -c 'import numpy'
  network: outbound             # of the run steps (or none)

Or a Dockerfile (-f Dockerfile): one stage, FROM a template or an image you
imported; RUN, ENV, ARG (--build-arg), WORKDIR, USER, COPY and ADD of local
files (--chown, --chmod) and SHELL become steps; an instruction evalbox does
not build is refused with its line.

The files the copy steps name are uploaded from CONTEXT_DIR (default: the
spec file's directory); nothing else is. The build log streams to stderr;
on success the template's digest is printed. A failed build exits 1 with the
failing step, its exit code and the end of its stderr. Ctrl-C stops
following; the build goes on on the server (evalbox template logs replays it).`,
		Example: `  evalbox template build -f task.yaml --name my-task
  evalbox template build -f environment/Dockerfile --name my-task environment
  evalbox sandbox create --template my-task
  evalbox template build -f task.yaml --name my-task --tag v2   # my-task:v2; my-task stays`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if specFile == "" || name == "" {
				return usagef(cmd, "-f SPEC and --name NAME are required")
			}
			raw, err := readSpec(cmd, specFile)
			if err != nil {
				return err
			}
			args, err := parseKV(cmd, "build-arg", buildArgs)
			if err != nil {
				return err
			}
			var spec client.TemplateSpec
			req := client.BuildTemplateRequest{}
			if isDockerfile(specFile) {
				df, err := template.ParseDockerfile(raw, args)
				if err != nil {
					return fmt.Errorf("%s: %w", specFile, err)
				}
				// The server translates it onto its FROM; here, only
				// for the files its COPY steps upload.
				if spec, err = df.Spec(client.Template{Name: df.From}); err != nil {
					return fmt.Errorf("%s: %w", specFile, err)
				}
				req.Dockerfile, req.BuildArgs = string(raw), args
			} else {
				if len(args) > 0 {
					return usagef(cmd, "--build-arg is for a Dockerfile (-f Dockerfile)")
				}
				if spec, err = template.ParseSpec(raw); err != nil {
					return fmt.Errorf("%s: %w", specFile, err)
				}
				req.Spec = spec
			}
			ctxDir := filepath.Dir(specFile)
			if specFile == "-" {
				ctxDir = "."
			}
			if len(argv) == 1 {
				ctxDir = argv[0]
			}
			c := a.client()
			if n, t, ok := strings.Cut(name, ":"); ok {
				name, tags = n, append([]string{t}, tags...)
			}
			req.Name, req.Tags = name, tags
			var b *client.TemplateBuild
			if srcs := template.CopySources(spec); len(srcs) > 0 {
				if err := checkSources(ctxDir, srcs); err != nil {
					return err
				}
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(writeTar(pw, ctxDir, srcs)) }()
				b, err = c.BuildTemplate(cmd.Context(), req, pr)
				pr.Close()
			} else {
				b, err = c.BuildTemplate(cmd.Context(), req, nil)
			}
			if err != nil {
				return err
			}
			return followBuild(cmd, c, b, detach, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&specFile, "file", "f", "", "build spec, YAML or JSON, or a Dockerfile (a file named Dockerfile, Dockerfile.*, *.Dockerfile); - for stdin")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "a Dockerfile ARG's value, KEY=VALUE (repeatable)")
	f.StringVarP(&name, "name", "n", "", "template name (NAME:TAG: that tag)")
	f.StringArrayVarP(&tags, "tag", "t", nil, "a tag the build takes (repeatable; none: the untagged name, tag default)")
	f.BoolVarP(&detach, "detach", "d", false, "print the build id and return at once")
	f.BoolVar(&asJSON, "json", false, "print the build (as it ended) as JSON instead of the digest")
	return cmd
}

func newTemplateImportCmd(a *app) *cobra.Command {
	var (
		name, ref, image string
		detach, asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "import --name NAME (IMAGE.tar | OCI_LAYOUT_DIR | --image REF)",
		Short: "Import an OCI image (docker-archive tarball, OCI layout, or registry) as a template",
		Long: `Import an OCI image as a template: a docker-archive tarball (docker save), an
OCI image layout directory, or with --image a registry reference the server
pulls. The template keeps the image's env, workdir and user. The import log
streams to stderr; on success the template's digest is printed.`,
		Example: `  docker save python:3.12-slim -o py.tar && evalbox template import --name py312 py.tar
  evalbox template import --name alpine --image docker.io/library/alpine:3.20`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if name == "" {
				return usagef(cmd, "--name is required")
			}
			if (len(argv) == 1) == (image != "") {
				return usagef(cmd, "give an image archive or layout directory, or --image, not both")
			}
			c := a.client()
			o := client.ImportOptions{Name: name, Ref: ref, Image: image}
			var b *client.TemplateBuild
			var err error
			if image != "" {
				b, err = c.ImportTemplate(cmd.Context(), o, nil, 0)
			} else {
				b, err = importPath(cmd.Context(), c, o, argv[0])
			}
			if err != nil {
				return err
			}
			return followBuild(cmd, c, b, detach, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&name, "name", "n", "", "template name")
	f.StringVar(&ref, "ref", "", "which image of an archive or layout holding several (tag or ref name)")
	f.StringVar(&image, "image", "", "registry reference to pull instead of a local image")
	f.BoolVarP(&detach, "detach", "d", false, "print the build id and return at once")
	f.BoolVar(&asJSON, "json", false, "print the import (as it ended) as JSON instead of the digest")
	return cmd
}

// importPath uploads an image archive (a file) or an OCI layout (a
// directory, sent as a tar archive).
func importPath(ctx context.Context, c *client.Client, o client.ImportOptions, p string) (*client.TemplateBuild, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(p, "oci-layout")); err != nil {
			return nil, fmt.Errorf("%s is not an OCI image layout (no oci-layout file)", p)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTar(pw, p, []string{"."})) }()
		defer pr.Close()
		return c.ImportTemplate(ctx, o, pr, -1)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return c.ImportTemplate(ctx, o, f, fi.Size())
}

func newTemplateLogsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "logs NAME BUILD_ID",
		Short: "Print a build's log (following it while it runs)",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c := a.client()
			b, err := c.GetBuild(cmd.Context(), argv[0], argv[1])
			if err != nil {
				return err
			}
			return followBuild(cmd, c, b, false, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the build (as it ended) as JSON")
	return cmd
}

// followBuild streams a build's log to stderr and reports how it ended:
// the digest on stdout, or an error naming the failing step.
func followBuild(cmd *cobra.Command, c *client.Client, b *client.TemplateBuild, detach, asJSON bool) error {
	if detach {
		if asJSON {
			return printJSON(out(cmd), b)
		}
		_, err := fmt.Fprintln(out(cmd), b.ID)
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "%s %s of %s (evalbox template logs %s %s)\n", b.Kind, b.ID, b.Template, b.Template, b.ID)
	end, err := c.FollowBuild(cmd.Context(), b.Template, b.ID, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(out(cmd), end); err != nil {
			return err
		}
	}
	if end.State != client.BuildStateSucceeded {
		msg := fmt.Sprintf("%s %s of %s failed", end.Kind, end.ID, end.Template)
		if end.Error != "" {
			msg += ": " + end.Error
		}
		return &exitError{code: ExitError, msg: msg}
	}
	if !asJSON {
		_, err = fmt.Fprintln(out(cmd), end.Digest)
	}
	return err
}

func readSpec(cmd *cobra.Command, p string) ([]byte, error) {
	if p == "-" {
		return io.ReadAll(io.LimitReader(cmd.InOrStdin(), 4<<20))
	}
	return os.ReadFile(p)
}

// checkSources checks the copy sources locally before anything is sent
// (the server checks again).
func checkSources(root string, srcs []string) error {
	for _, s := range srcs {
		if _, err := os.Lstat(filepath.Join(root, s)); err != nil {
			return fmt.Errorf("build context %s: %w", root, err)
		}
	}
	return nil
}

// writeTar writes the sources (paths relative to root; "." for all of it)
// as a tar archive: regular files, directories and symlinks (never
// followed), with their modes; owners are not sent.
func writeTar(w io.Writer, root string, srcs []string) error {
	return writeTarSkipping(w, root, srcs, nil)
}

// writeTarSkipping is writeTar, leaving out the entries skip names (a
// skipped directory with all it holds).
func writeTarSkipping(w io.Writer, root string, srcs []string, skip func(rel string, d fs.DirEntry) bool) error {
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	for _, src := range srcs {
		err := filepath.WalkDir(filepath.Join(root, src), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return fmt.Errorf("%s is outside %s", p, root)
			}
			rel = filepath.ToSlash(rel)
			if skip != nil && rel != "." && skip(rel, d) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if seen[rel] {
				return nil
			}
			seen[rel] = true
			info, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			switch {
			case info.Mode()&fs.ModeSymlink != 0:
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			case info.IsDir(), info.Mode().IsRegular():
			default:
				return fmt.Errorf("%s: only files, directories and symlinks can be sent", p)
			}
			hdr, err := tar.FileInfoHeader(info, link)
			if err != nil {
				return err
			}
			hdr.Name = rel
			if info.IsDir() {
				hdr.Name += "/"
			}
			hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if !info.Mode().IsRegular() {
				return nil
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		})
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

// isDockerfile reports whether a build file is a Dockerfile by its name:
// Dockerfile, Dockerfile.NAME or NAME.Dockerfile (any case).
func isDockerfile(p string) bool {
	b := strings.ToLower(filepath.Base(p))
	return b == "dockerfile" || strings.HasPrefix(b, "dockerfile.") || strings.HasSuffix(b, ".dockerfile")
}
