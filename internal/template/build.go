package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/pkg/client"
)

// Runner runs build commands, each in a fresh throwaway sandbox (gVisor:
// the node implements it).
type Runner interface {
	RunBuildStep(ctx context.Context, s RunStep) (RunResult, error)
}

// RunStep is one command of a build.
type RunStep struct {
	// ID names the build sandbox ([a-z0-9-], unique on the host).
	ID string
	// RootFS is the sandbox's root, never written: the layers so far.
	RootFS string
	// Shell is run as /bin/sh -c Shell with Env, in Workdir, as User.
	Shell   string
	Env     []string
	Workdir string
	User    string
	Network string
	// Output receives the command's stdout and stderr as they come.
	Output io.Writer
	// UpperTar, if set, is the file that receives what the command changed
	// in the root filesystem: a tar archive in overlayfs format.
	UpperTar string
}

// RunResult is how a build command ended.
type RunResult struct {
	Status   string // agentproto status: exited, killed, timed_out
	ExitCode int    // -1 unless exited
	// StderrTail is the end of its stderr, for the error message.
	StderrTail string
}

// StepError is a build step that failed.
type StepError struct {
	Step     int    // 1-based; 0 for the ready_cmd check
	Kind     string // run, copy, …, or ready_cmd
	ExitCode int    // of a run step; -1 when it did not exit by itself
	Status   string
	Tail     string // end of the step's stderr
	Err      error  // a failure that was not the command's
}

func (e *StepError) Error() string {
	where := fmt.Sprintf("step %d (%s)", e.Step, e.Kind)
	if e.Step == 0 {
		where = e.Kind
	}
	if e.Err != nil {
		return fmt.Sprintf("%s failed: %v", where, e.Err)
	}
	msg := fmt.Sprintf("%s failed: exit code %d", where, e.ExitCode)
	if e.Status != "" && e.Status != "exited" {
		msg = fmt.Sprintf("%s failed: %s", where, strings.ReplaceAll(e.Status, "_", " "))
	}
	if t := strings.TrimSpace(e.Tail); t != "" {
		msg += ": " + t
	}
	return msg
}

func (e *StepError) Unwrap() error { return e.Err }

// Builder builds templates from build specs on the registry's store.
type Builder struct {
	reg *Registry
	run Runner
	log *slog.Logger
}

// NewBuilder returns a Builder that runs steps with run.
func NewBuilder(reg *Registry, run Runner, log *slog.Logger) *Builder {
	if log == nil {
		log = slog.Default()
	}
	return &Builder{reg: reg, run: run, log: log}
}

// BuildRequest is one build.
type BuildRequest struct {
	// ID is the build's id; it names the work directory and the build
	// sandboxes.
	ID string
	// TeamID is the team the build is for: its layers (and so its
	// template digest) are its own, never another team's (see Build).
	TeamID string
	Name   string
	Spec   client.TemplateSpec
	// From is the resolved template of Spec.From: for from: snapshot:ID,
	// the snapshot's template, with FromLayer its files.
	From *Template
	// FromLayer, if set, is the build's first layer, over From.
	FromLayer *FilesLayer
	// Cmd is recorded on the template (a Dockerfile's ENTRYPOINT and
	// CMD), not run.
	Cmd []string
	// ContextDir is the extracted build context ("" = none).
	ContextDir string
	// Network of the run steps (Spec.Network, or the server's).
	Network string
	// Log receives the build log.
	Log io.Writer
	// Charge, if set, is told the size of each file a run step's layer
	// holds before it is written; its error fails the step (a storage
	// quota).
	Charge func(n int64) error
}

// FilesLayer is an archive of a copy-on-write layer (what
// runtime.UpperExporter writes) that a build starts from: the files of a
// snapshot (from: snapshot:ID).
type FilesLayer struct {
	// Key names its content for good (a snapshot's id: snapshots do not
	// change); the layer's digest is made of it, so a second build of it
	// finds it in the layer cache without opening it.
	Key string
	// Open opens the archive.
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// BuildResult is what a build did.
type BuildResult struct {
	Template *Template
	// Steps is the number of steps; Cached the run and copy steps whose
	// layer came from the cache; Built those that ran.
	Steps, Cached, Built int
}

// config is what env, workdir and user steps change.
type config struct {
	Env     map[string]string `json:"env"`
	Workdir string            `json:"workdir"`
	User    string            `json:"user"`
}

// digestOf hashes parts as one JSON array.
func digestOf(parts ...any) string {
	b, err := json.Marshal(parts)
	if err != nil {
		panic(err) // only plain values are hashed
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func short(d string) string {
	h := strings.TrimPrefix(d, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// sandboxID turns a build id and step into a runtime sandbox id.
func sandboxID(buildID string, step int) string {
	id := strings.ToLower(strings.ReplaceAll(buildID, "_", "-"))
	return fmt.Sprintf("%s-%d", id, step)
}

// Build runs req's steps on top of req.From, one cached layer per run or
// copy step, and stores the result under its digest. The digest depends
// only on the inputs (the team, From's digest, the steps and the network
// of run steps, the copied files' content, the defaults), so the same spec
// and context of a team always give the same digest, and a layer whose
// inputs did not change comes from the cache. The team is an input: a
// run step's output is not a function of the step (it may download
// anything), so a layer one team built is never another's, and its
// "CACHED" never tells a team what another built.
// A failed build leaves no template and no half-written layer (layers of
// the steps before the failure stay cached). The result's counters are
// set on error too.
func (b *Builder) Build(ctx context.Context, req BuildRequest) (res BuildResult, err error) {
	if err := b.reg.needStore(); err != nil {
		return res, err
	}
	spec := req.Spec
	res.Steps = len(spec.Steps)
	logw := req.Log
	if logw == nil {
		logw = io.Discard
	}
	logf := func(format string, a ...any) { fmt.Fprintf(logw, format+"\n", a...) }
	work, err := os.MkdirTemp(filepath.Join(b.reg.store, tmpDir), req.ID+"-build-")
	if err != nil {
		return res, fmt.Errorf("template: %w", err)
	}
	defer func() {
		if rerr := removeTree(work); rerr != nil && err == nil {
			err = fmt.Errorf("template: %w", rerr)
		}
	}()

	from := req.From
	cfg := config{Env: maps.Clone(from.Defaults.Env), Workdir: from.Defaults.Workdir, User: from.Defaults.User}
	if cfg.Env == nil {
		cfg.Env = map[string]string{}
	}
	if cfg.Workdir == "" {
		cfg.Workdir = "/"
	}
	if cfg.User == "" {
		cfg.User = "root"
	}
	logf("building %s from %s (%s), %d steps", req.Name, spec.From, short(from.Digest), len(spec.Steps))
	chain := digestOf("layers/v2", req.TeamID, from.Digest)
	var layers []string // committed layer dirs, bottom first
	var layerDigests []string
	if fl := req.FromLayer; fl != nil {
		chain = digestOf("from-layer", chain, fl.Key)
		if b.reg.HasLayer(chain) {
			logf("#0 %s's files CACHED %s", spec.From, short(chain))
		} else {
			start := time.Now()
			if err := b.filesLayer(ctx, req, filepath.Join(work, "layer-0"), chain); err != nil {
				return res, &StepError{Kind: "from", Err: err}
			}
			logf("#0 %s's files DONE %s in %s", spec.From, short(chain), time.Since(start).Round(time.Millisecond))
		}
		layers = append(layers, b.reg.layerPath(chain))
		layerDigests = append(layerDigests, chain)
	}
	for i, st := range spec.Steps {
		n := i + 1
		kind := StepKind(st)
		if err := ctx.Err(); err != nil {
			return res, &StepError{Step: n, Kind: kind, Err: err}
		}
		switch kind {
		case StepEnv:
			maps.Copy(cfg.Env, st.Env)
			chain = digestOf("step", chain, kind, st.Env)
			logf("#%d/%d env %s", n, len(spec.Steps), strings.Join(sortedKeys(st.Env), " "))
			continue
		case StepWorkdir:
			cfg.Workdir = path.Clean(st.Workdir)
			chain = digestOf("step", chain, kind, cfg.Workdir)
			logf("#%d/%d workdir %s", n, len(spec.Steps), cfg.Workdir)
			continue
		case StepUser:
			cfg.User = st.User
			chain = digestOf("step", chain, kind, st.User)
			logf("#%d/%d user %s", n, len(spec.Steps), st.User)
			continue
		case StepRun:
			// With the network it ran with: a step without network must not
			// reuse a layer made with it.
			chain = digestOf("step", chain, kind, st.Run, req.Network)
			logf("#%d/%d run %s", n, len(spec.Steps), oneLine(st.Run))
		case StepCopy:
			src, _ := contextPath(st.Copy.Src)
			sum, err := hashSource(req.ContextDir, src)
			if err != nil {
				return res, &StepError{Step: n, Kind: kind, Err: fmt.Errorf("reading the build context: %w", err)}
			}
			chain = digestOf("step", chain, kind, src, st.Copy.Dst, cfg.Workdir, sum)
			attrs := ""
			if st.Copy.Owner != "" || st.Copy.Mode != "" {
				chain = digestOf("copy-attrs", chain, st.Copy.Owner, st.Copy.Mode)
				attrs = fmt.Sprintf(" (owner %q, mode %q)", st.Copy.Owner, st.Copy.Mode)
			}
			logf("#%d/%d copy %s %s%s", n, len(spec.Steps), st.Copy.Src, st.Copy.Dst, attrs)
		default:
			return res, &StepError{Step: n, Kind: "?", Err: errors.New("invalid step")}
		}
		if b.reg.HasLayer(chain) {
			res.Cached++
			layers = append(layers, b.reg.layerPath(chain))
			layerDigests = append(layerDigests, chain)
			logf("#%d CACHED %s", n, short(chain))
			continue
		}
		start := time.Now()
		layerDir := filepath.Join(work, fmt.Sprintf("layer-%d", n))
		if err := b.step(ctx, req, n, st, cfg, from, layers, work, layerDir, logw); err != nil {
			return res, err
		}
		if err := b.reg.commitLayer(layerDir, chain); err != nil {
			return res, &StepError{Step: n, Kind: kind, Err: err}
		}
		res.Built++
		layers = append(layers, b.reg.layerPath(chain))
		layerDigests = append(layerDigests, chain)
		logf("#%d DONE %s in %s", n, short(chain), time.Since(start).Round(time.Millisecond))
	}

	defaults := from.Defaults
	defaults.Env, defaults.Workdir, defaults.User = cfg.Env, cfg.Workdir, cfg.User
	if spec.StartCmd != "" || spec.ReadyCmd != "" {
		// The pair is the spec's, or From's: a start command and the
		// check that it is up go together.
		defaults.StartCmd, defaults.ReadyCmd = spec.StartCmd, spec.ReadyCmd
	}
	if spec.CPU > 0 {
		defaults.CPU = spec.CPU
	}
	if spec.MemoryMB > 0 {
		defaults.MemoryMB = spec.MemoryMB
	}
	if spec.DiskMB > 0 {
		defaults.DiskMB = spec.DiskMB
	}
	digest := digestOf("template/v1", chain, defaults)
	if len(req.Cmd) > 0 {
		// A recorded command is part of what the template is.
		digest = digestOf("template/v1", chain, defaults, req.Cmd)
	}
	if b.reg.HasStored(digest) {
		t, err := b.reg.Get(digest)
		if err != nil {
			return res, err
		}
		logf("template %s is already built (same inputs)", short(digest))
		res.Template = t
		return res, nil
	}
	logf("flattening %d layers", len(layers))
	start := time.Now()
	tdir := filepath.Join(work, "template")
	if err := os.Mkdir(tdir, 0o700); err != nil {
		return res, fmt.Errorf("template: %w", err)
	}
	rootfs := filepath.Join(tdir, "rootfs")
	if err := flatten(rootfs, reversed(layers), from.RootFS); err != nil {
		return res, fmt.Errorf("template: flatten: %w", err)
	}
	if err := prepareRootFS(rootfs); err != nil {
		return res, fmt.Errorf("template: %w", err)
	}
	size, err := DirSize(rootfs)
	if err != nil {
		return res, fmt.Errorf("template: %w", err)
	}
	own, err := b.reg.storageBytes(rootfs)
	if err != nil {
		return res, err
	}
	logf("flattened in %s: %s (%s of its own)", time.Since(start).Round(time.Millisecond), humanSize(size), humanSize(own))
	if spec.ReadyCmd != "" {
		// As a sandbox will: the start command in the background, then
		// the check.
		check := spec.ReadyCmd
		if spec.StartCmd != "" {
			logf("start_cmd %s", oneLine(spec.StartCmd))
			check = "(" + spec.StartCmd + "\n) </dev/null >/dev/null 2>&1 &\n" + spec.ReadyCmd
		}
		logf("ready_cmd %s", oneLine(spec.ReadyCmd))
		r, err := b.run.RunBuildStep(ctx, RunStep{ID: sandboxID(req.ID, 0), RootFS: rootfs, Shell: check,
			Env: envList(cfg.Env), Workdir: cfg.Workdir, User: cfg.User, Network: client.NetworkNone, Output: logw})
		if err != nil {
			return res, &StepError{Kind: "ready_cmd", Err: err}
		}
		if r.Status != "exited" || r.ExitCode != 0 {
			return res, &StepError{Kind: "ready_cmd", ExitCode: r.ExitCode, Status: r.Status, Tail: r.StderrTail}
		}
	}
	t := &Template{Name: req.Name, Digest: digest, SizeBytes: size, StorageBytes: own, BuiltAt: time.Now().UTC(), Defaults: defaults,
		Source: SourceBuild, From: from.Digest, Layers: layerDigests, Cmd: req.Cmd}
	if err := writeTemplateJSON(tdir, t); err != nil {
		return res, err
	}
	if err := b.reg.commitStored(tdir, digest); err != nil {
		return res, err
	}
	res.Template, err = b.reg.Get(digest)
	if err != nil {
		return res, err
	}
	logf("built %s", digest)
	return res, nil
}

// step runs one run or copy step into layerDir. The root it works on is
// the layers so far over From: a read-only overlay mount of them under
// work (unmounted before it returns), or From's rootfs itself for the
// first layer.
func (b *Builder) step(ctx context.Context, req BuildRequest, n int, st client.TemplateStep, cfg config,
	from *Template, layers []string, work, layerDir string, logw io.Writer) error {
	kind := StepKind(st)
	root := from.RootFS
	if len(layers) > 0 {
		root = filepath.Join(work, fmt.Sprintf("root-%d", n))
		if err := os.Mkdir(root, 0o700); err != nil {
			return &StepError{Step: n, Kind: kind, Err: err}
		}
		if err := mountOverlay(root, append(reversed(layers), from.RootFS)); err != nil {
			return &StepError{Step: n, Kind: kind, Err: err}
		}
		defer func() {
			if err := unmount(root); err != nil {
				b.log.Error("template build: unmount", "build", req.ID, "err", err)
			}
		}()
	}
	if err := os.Mkdir(layerDir, 0o700); err != nil {
		return &StepError{Step: n, Kind: kind, Err: err}
	}
	if kind == StepCopy {
		src, _ := contextPath(st.Copy.Src)
		attrs := &copyAttrs{owner: st.Copy.Owner, mode: st.Copy.Mode}
		if err := buildCopyLayer(layerDir, root, req.ContextDir, src, st.Copy.Dst, cfg.Workdir, attrs); err != nil {
			return &StepError{Step: n, Kind: kind, Err: err}
		}
		return nil
	}
	upper := filepath.Join(work, fmt.Sprintf("upper-%d.tar", n))
	r, err := b.run.RunBuildStep(ctx, RunStep{ID: sandboxID(req.ID, n), RootFS: root, Shell: st.Run,
		Env: envList(cfg.Env), Workdir: cfg.Workdir, User: cfg.User, Network: req.Network, Output: logw, UpperTar: upper})
	if err != nil {
		if ctx.Err() != nil {
			// Cancelled or past the build's deadline: say so, not how the
			// sandbox went away.
			err = ctx.Err()
		}
		return &StepError{Step: n, Kind: kind, Err: err}
	}
	if r.Status != "exited" || r.ExitCode != 0 {
		return &StepError{Step: n, Kind: kind, ExitCode: r.ExitCode, Status: r.Status, Tail: r.StderrTail}
	}
	f, err := os.Open(upper)
	if err != nil {
		return &StepError{Step: n, Kind: kind, Err: fmt.Errorf("the step's changes: %w", err)}
	}
	_, err = extractTar(f, layerDir, extractOptions{layer: true, charge: req.Charge})
	f.Close()
	_ = os.Remove(upper)
	if err != nil {
		return &StepError{Step: n, Kind: kind, Err: fmt.Errorf("unpacking the step's changes: %w", err)}
	}
	// The agent's mount point is the runtime's, not the step's.
	if err := os.RemoveAll(filepath.Join(layerDir, ".evalbox")); err != nil {
		return &StepError{Step: n, Kind: kind, Err: err}
	}
	return nil
}

// filesLayer unpacks req.FromLayer into layerDir, as a run step's changes
// are, and commits it as the layer chain.
func (b *Builder) filesLayer(ctx context.Context, req BuildRequest, layerDir, chain string) error {
	rc, err := req.FromLayer.Open(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := os.Mkdir(layerDir, 0o700); err != nil {
		return err
	}
	if _, err := extractTar(rc, layerDir, extractOptions{layer: true, charge: req.Charge}); err != nil {
		return fmt.Errorf("unpacking the files: %w", err)
	}
	if err := os.RemoveAll(filepath.Join(layerDir, ".evalbox")); err != nil {
		return err
	}
	return b.reg.commitLayer(layerDir, chain)
}

// prepareRootFS adds what every runtime needs in a root filesystem: the
// mount point of the guest agent, /.evalbox/agent (an empty file). What an
// image or a build put there instead (a symlink, say) is replaced, never
// followed.
func prepareRootFS(rootfs string) error {
	dir := filepath.Join(rootfs, ".evalbox")
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		if err := os.Remove(dir); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	agent := filepath.Join(dir, "agent")
	if fi, err := os.Lstat(agent); err == nil {
		if fi.Mode().IsRegular() {
			return nil
		}
		if err := os.RemoveAll(agent); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(agent, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o755)
	if err != nil {
		return err
	}
	return f.Close()
}

func writeTemplateJSON(dir string, t *Template) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "template.json"), b, 0o644); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	return nil
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
