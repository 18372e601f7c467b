// Package template keeps the root filesystems sandboxes start from, on the
// host: the built-in templates, the layer cache and the templates built from
// build specs or imported from OCI images.
//
// Built-ins live in the registry's directory as <dir>/<name>/ holding
// rootfs/ (the root filesystem, never written once built) and template.json
// (its digest and defaults). They are bootstrapped from the host's Debian
// mirror with mmdebstrap and cached by the digest of their build spec: they
// are rebuilt only when the spec changes. The directory is a cache that
// several servers may share.
//
// Built and imported templates live in the store (UseStore), addressed by
// their digest: <store>/templates/<hex>/{rootfs,template.json}. A build runs
// its steps one cached layer at a time (<store>/layers/<hex>, directories in
// overlayfs format) and flattens the layers into the template's rootfs at the
// end, so that every runtime still gets one read-only directory. See
// Builder.
package template

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/evalbox/evalbox/internal/interpreter"
)

// ErrNotFound is returned for an unknown template.
var ErrNotFound = errors.New("template not found")

// Sources of a template.
const (
	SourceBuiltin = "builtin" // bootstrapped from Debian with mmdebstrap
	SourceBuild   = "build"   // built from a build spec
	SourceImport  = "import"  // imported from an OCI image
)

// Template is a built template.
type Template struct {
	// Name is the built-in's name, or the name the template was first
	// built under (a team's names for it are kept by the control plane).
	Name      string `json:"name"`
	Digest    string `json:"digest"`
	SizeBytes int64  `json:"size_bytes"`
	// StorageBytes is what the template counts against its team's
	// storage limit: the bytes of its files it does not share with a
	// built-in (see storageBytes). 0 for built-ins and for templates stored
	// before it was recorded (see StorageBytes).
	StorageBytes int64     `json:"storage_bytes,omitempty"`
	BuiltAt      time.Time `json:"built_at"`
	Defaults     Defaults  `json:"defaults"`
	// Source is SourceBuiltin, SourceBuild or SourceImport.
	Source string `json:"source,omitempty"`
	// From is the digest of the template a build started from, or the
	// image reference and manifest digest of an import.
	From string `json:"from,omitempty"`
	// Layers are the digests of the build's layers, bottom first.
	Layers []string `json:"layers,omitempty"`
	// Cmd is an imported image's entrypoint and command, recorded (not
	// started: every sandbox's first process is the guest agent).
	Cmd []string `json:"cmd,omitempty"`
	// RootFS is the absolute path of the root filesystem (not stored).
	RootFS string `json:"-"`
}

// Defaults are what a sandbox of the template gets unless the request says
// otherwise.
type Defaults struct {
	CPU      float64           `json:"cpu"`
	MemoryMB int               `json:"memory_mb"`
	DiskMB   int               `json:"disk_mb"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir"`
	User     string            `json:"user"`
	// StartCmd, when set, starts (sh -c) as a background process of every
	// new sandbox of the template (warm pools' too), before ReadyCmd: a
	// server the template provides. It is listed with the tag start-cmd.
	StartCmd string `json:"start_cmd,omitempty"`
	// ReadyCmd, when set, runs (sh -c) in every new sandbox of the
	// template before it is handed out; a non-zero exit fails the start.
	ReadyCmd string `json:"ready_cmd,omitempty"`
}

// EnvList is the template's default environment as sorted KEY=VALUE.
func (t *Template) EnvList() []string { return envList(t.Defaults.Env) }

func envList(m map[string]string) []string {
	env := make([]string, 0, len(m))
	for k, v := range m {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// BuiltinSpec is how a built-in template is bootstrapped from Debian.
type BuiltinSpec struct {
	Name     string   `json:"name"`
	Suite    string   `json:"suite"`
	Variant  string   `json:"variant"`
	Packages []string `json:"packages"`
	// Files are written into the root filesystem after the packages
	// (absolute path → content, mode 0644, parents 0755): evalbox's own
	// programs that the template runs.
	Files map[string]string `json:"files,omitempty"`
	// Npm are npm packages (name@version, pinned) installed after the
	// Files by the host's npm, globally under the rootfs's /usr/local
	// (their commands in /usr/local/bin), their install scripts not run:
	// tools Debian does not package, such as TypeScript's compiler.
	Npm []string `json:"npm,omitempty"`
	// EssentialHooks are shell commands mmdebstrap runs once the
	// Essential packages are in, before the others ($1 is the rootfs):
	// what a package's maintainer script needs that the build's
	// path-excludes leave out (openjdk's postinst needs
	// /usr/share/man/man1).
	EssentialHooks []string `json:"essential_hooks,omitempty"`
	Defaults       Defaults `json:"defaults"`
}

var baseDefaults = Defaults{
	CPU: 1, MemoryMB: 512, DiskMB: 1024, Workdir: "/work", User: "root",
	Env: map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"},
}

// Builtins are the templates every installation has.
var Builtins = map[string]BuiltinSpec{
	"base": {Name: "base", Suite: "bookworm", Variant: "minbase",
		Packages: []string{"bash", "coreutils", "ca-certificates"}, Defaults: baseDefaults},
	"python": {Name: "python", Suite: "bookworm", Variant: "minbase",
		Packages: []string{"bash", "coreutils", "ca-certificates", "python3", "python3-pip", "python3-venv"}, Defaults: baseDefaults},
	"node": {Name: "node", Suite: "bookworm", Variant: "minbase",
		Packages: []string{"bash", "coreutils", "ca-certificates", "nodejs", "npm"}, Defaults: baseDefaults},
	// The code interpreter (internal/interpreter): Python with Jupyter's
	// kernel stack and the libraries model code reaches for first, from
	// Debian, and evalbox's kernel server, started in every sandbox.
	"code-interpreter": {Name: "code-interpreter", Suite: "bookworm", Variant: "minbase",
		Packages: []string{"bash", "coreutils", "ca-certificates", "python3", "python3-pip", "python3-venv",
			"python3-ipykernel", "python3-jupyter-client", "python3-matplotlib", "python3-numpy", "python3-pandas"},
		Files:    map[string]string{interpreter.Path: interpreter.Server},
		Defaults: interpreterDefaults},
	// Every toolchain of internal/lang (docs/languages.md): C and C++
	// (GCC), Java (OpenJDK 17), Node.js with TypeScript's compiler (npm),
	// Go, Rust, Python and bash.
	"polyglot": {Name: "polyglot", Suite: "bookworm", Variant: "minbase",
		Packages: []string{"bash", "coreutils", "ca-certificates", "python3", "gcc", "g++", "libc6-dev",
			"openjdk-17-jdk-headless", "nodejs", "golang-go", "rustc"},
		Npm:            []string{"typescript@5.6.3", "@types/node@18.19.130"},
		EssentialHooks: []string{manDirsHook},
		Defaults:       polyglotDefaults},
}

// manDirsHook makes the manual's directories that update-alternatives
// links into (openjdk's postinst fails without them), which the build's
// path-exclude of /usr/share/man/* leaves out.
const manDirsHook = `mkdir -p "$1/usr/share/man/man1"`

// polyglotDefaults: the base's, with room for a JVM or rustc.
var polyglotDefaults = func() Defaults {
	d := baseDefaults
	d.MemoryMB = 1024
	return d
}()

// interpreterDefaults: the base's, with room for a kernel and its
// libraries, the server started and awaited.
var interpreterDefaults = func() Defaults {
	d := baseDefaults
	d.MemoryMB = 1024
	d.StartCmd = interpreter.StartCmd
	d.ReadyCmd = interpreter.ReadyCmd
	return d
}()

// BuiltinNames lists the built-ins, sorted.
func BuiltinNames() []string {
	names := make([]string, 0, len(Builtins))
	for n := range Builtins {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// IsBuiltin reports whether name is a built-in template.
func IsBuiltin(name string) bool {
	_, ok := Builtins[name]
	return ok
}

// Digest is the content hash of a built-in's spec (and so of its build).
func (s BuiltinSpec) Digest(mirror string) string {
	b, _ := json.Marshal(struct {
		Spec   BuiltinSpec
		Mirror string
	}{s, mirror})
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName reports whether name can name a template: 1–63 of a-z 0-9
// . _ -, starting with a letter or digit, and not "snap-…", the form of
// snapshot ids (the E2B layer takes a snapshot id where a template id
// goes).
func ValidName(name string) bool {
	return nameRE.MatchString(name) && !strings.HasPrefix(name, "snap-")
}

// DefaultTag is the tag of a template's untagged name: "name" and
// "name:default" are one (E2B's default tag).
const DefaultTag = "default"

var tagRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidTag reports whether tag can tag a template: 1–128 of A-Z a-z 0-9
// . _ -, starting with a letter or digit.
func ValidTag(tag string) bool { return tagRE.MatchString(tag) }

// SplitRef splits a template reference "name" or "name:tag"; the tag of
// an untagged name is DefaultTag.
func SplitRef(ref string) (name, tag string) {
	name, tag, ok := strings.Cut(ref, ":")
	if !ok || tag == "" {
		tag = DefaultTag
	}
	return name, tag
}

// SnapshotPrefix starts a spec's from that names one of the team's
// snapshots instead of a template (from: snapshot:ID): the build starts
// from the snapshot's template with the snapshot's files as its first
// layer. No template is named "snapshot" (ReservedName).
const SnapshotPrefix = "snapshot:"

// SnapshotRef returns the snapshot id of a from that names one.
func SnapshotRef(from string) (id string, ok bool) { return strings.CutPrefix(from, SnapshotPrefix) }

// ReservedName reports whether name may be no template's: a built-in, or
// "snapshot" (SnapshotPrefix).
func ReservedName(name string) bool { return IsBuiltin(name) || name+":" == SnapshotPrefix }

// Registry is the template store on this host: the built-ins in one
// directory and, once UseStore was called, the built and imported
// templates and the layer cache in another.
type Registry struct {
	dir   string
	store string // "" until UseStore
	log   *slog.Logger

	mu    sync.Mutex
	cache map[string]*Template // by built-in name or stored digest
	build sync.Mutex           // one built-in build at a time
	// usage caches DiskUsage; reset when the store changes.
	usage atomic.Int64
	// builtinSet caches the built-ins' files (storageBytes), for the
	// built-ins of builtinKey.
	builtinSet map[inode]bool
	builtinKey string
}

// Open opens (creating) the template store in dir.
func Open(dir string, log *slog.Logger) (*Registry, error) {
	if log == nil {
		log = slog.Default()
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	r := &Registry{dir: abs, log: log, cache: map[string]*Template{}}
	r.usage.Store(-1)
	return r, nil
}

// Dir is the directory of the built-ins.
func (r *Registry) Dir() string { return r.dir }

// Get returns a built template by a built-in's name or a stored
// template's digest (the catalog resolves names with it; a node uses
// ByDigest).
func (r *Registry) Get(ref string) (*Template, error) {
	r.mu.Lock()
	t, ok := r.cache[ref]
	r.mu.Unlock()
	if ok {
		return t, nil
	}
	var err error
	if hexDigest, isDigest := strings.CutPrefix(ref, "sha256:"); isDigest {
		t, err = r.loadStored(hexDigest)
	} else if ValidName(ref) {
		t, err = r.load(ref)
	} else {
		err = fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.cache[ref] = t
	r.mu.Unlock()
	return t, nil
}

// ByDigest returns a built template by its digest: a stored template, or
// the built-in whose build has that digest. It is how a node finds the
// template of a sandbox it is asked for: the control plane resolved the
// name once, and the digest (which covers the files and the defaults) is
// what reaches the node. Hits are cached; a miss reads template.json
// files.
func (r *Registry) ByDigest(digest string) (*Template, error) {
	if hexOf(digest) == "" {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, digest)
	}
	r.mu.Lock()
	t, ok := r.cache[digest]
	if !ok {
		// Built-ins are cached by name.
		for _, name := range builtinNames {
			if b := r.cache[name]; b != nil && b.Digest == digest {
				t, ok = b, true
				break
			}
		}
	}
	r.mu.Unlock()
	if ok {
		return t, nil
	}
	if r.HasStored(digest) {
		return r.Get(digest)
	}
	for _, name := range builtinNames {
		b, err := r.Get(name)
		if err == nil && b.Digest == digest {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNotFound, digest)
}

// builtinNames is BuiltinNames(), computed once.
var builtinNames = BuiltinNames()

func (r *Registry) load(name string) (*Template, error) {
	t, err := readTemplate(filepath.Join(r.dir, name), name)
	if err != nil {
		return nil, err
	}
	t.Source = SourceBuiltin
	return t, nil
}

// readTemplate reads dir/template.json; dir/rootfs is the root filesystem.
func readTemplate(dir, what string) (*Template, error) {
	b, err := os.ReadFile(filepath.Join(dir, "template.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, what)
	}
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", what, err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("template %s: %w", what, err)
	}
	t.RootFS = filepath.Join(dir, "rootfs")
	return &t, nil
}

// List returns every built-in that is built, by name.
func (r *Registry) List() ([]*Template, error) {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	var out []*Template
	for _, e := range entries {
		if !e.IsDir() || !ValidName(e.Name()) {
			continue
		}
		t, err := r.Get(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// HostMirror reads the first Debian mirror from the host's apt sources
// (deb822 .sources or one-line sources.list), or "" if none is found.
func HostMirror() string {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, "/etc/apt/sources.list")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if v, ok := strings.CutPrefix(line, "URIs:"); ok {
				for _, u := range strings.Fields(v) {
					if !strings.Contains(u, "security") {
						return u
					}
				}
			}
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "deb" {
				for _, u := range f[1:] {
					if strings.Contains(u, "://") && !strings.Contains(u, "security") {
						return u
					}
				}
			}
		}
	}
	return ""
}

// EnsureBuiltin builds the built-in template name unless a build of the same
// spec exists. Build output goes to logw. The template appears atomically:
// a failed build leaves nothing.
func (r *Registry) EnsureBuiltin(ctx context.Context, name, mirror string, logw io.Writer) (*Template, error) {
	spec, ok := Builtins[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q is not a built-in", ErrNotFound, name)
	}
	if mirror == "" {
		mirror = HostMirror()
	}
	if mirror == "" {
		return nil, errors.New("template: no Debian mirror: set --mirror or EVALBOX_DEBIAN_MIRROR")
	}
	digest := spec.Digest(mirror)
	r.build.Lock()
	defer r.build.Unlock()
	// Other processes may share the directory (several servers, tests):
	// one builds, the others find its result.
	unlock, err := lockFile(ctx, filepath.Join(r.dir, ".build.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if t, err := r.load(name); err == nil && t.Digest == digest {
		return t, nil
	}
	if len(spec.Npm) > 0 {
		if _, err := npmFor(spec.Npm); err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
	}
	r.log.Info("building template", "template", name, "mirror", mirror)
	start := time.Now()
	tmp, err := os.MkdirTemp(r.dir, "."+name+".build-")
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	defer os.RemoveAll(tmp)
	rootfs := filepath.Join(tmp, "rootfs")
	cmd := exec.CommandContext(ctx, "mmdebstrap", spec.mmdebstrapArgs(rootfs, mirror)...)
	if logw == nil {
		logw = io.Discard
	}
	cmd.Stdout, cmd.Stderr = logw, logw
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("template %s: mmdebstrap: %w", name, err)
	}
	for _, d := range []string{"work", ".evalbox"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
	}
	// The agent binary is bind-mounted over this file.
	if err := os.WriteFile(filepath.Join(rootfs, ".evalbox", "agent"), nil, 0o755); err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	for p, content := range spec.Files {
		dst := filepath.Join(rootfs, filepath.Clean("/"+p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
		if err := os.WriteFile(dst, []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
	}
	if err := installNpm(ctx, rootfs, tmp, spec.Npm, logw); err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	size, err := DirSize(rootfs)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	t := &Template{Name: name, Digest: digest, SizeBytes: size, BuiltAt: time.Now().UTC(), Defaults: spec.Defaults, Source: SourceBuiltin}
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "template.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	final := filepath.Join(r.dir, name)
	old := final + ".old"
	_ = os.RemoveAll(old)
	if _, err := os.Stat(final); err == nil {
		if err := os.Rename(final, old); err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	_ = os.RemoveAll(old)
	r.mu.Lock()
	delete(r.cache, name)
	r.mu.Unlock()
	r.usage.Store(-1)
	r.log.Info("built template", "template", name, "digest", digest, "size_bytes", size, "duration", time.Since(start).Round(time.Millisecond))
	return r.Get(name)
}

// mmdebstrapArgs are the arguments of the spec's mmdebstrap into rootfs:
// no manuals, docs or locales, and the spec's essential hooks.
func (s BuiltinSpec) mmdebstrapArgs(rootfs, mirror string) []string {
	args := []string{"--variant=" + s.Variant, "--include=" + strings.Join(s.Packages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-include=/usr/share/locale/locale.alias"}
	for _, h := range s.EssentialHooks {
		args = append(args, "--essential-hook="+h)
	}
	return append(args, s.Suite, rootfs, mirror)
}

// lockFile takes an exclusive flock on path, waiting until ctx ends.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("template: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// DirSize is the size of the regular files under root.
func DirSize(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}
