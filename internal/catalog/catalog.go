// Package catalog is the control plane's template service: a team's
// templates (names pointing at stored template digests), builds from build
// specs and imports of OCI images, their logs, and the admission of builds
// (a per-team cap and a server-wide cap, queued FIFO, with a timeout).
//
// The templates themselves — root filesystems, layers, the build steps —
// are the host's business (internal/template, with the node running the
// build sandboxes); the catalog keeps the rows in the store and decides who
// may see, use, build and delete what. Built-ins belong to every team; a
// team's own templates are invisible to other teams (404).
package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// Store is what the catalog needs of the state store.
type Store interface {
	PutTemplate(ctx context.Context, t store.TemplateRow) (string, error)
	GetTemplate(ctx context.Context, teamID, name string) (store.TemplateRow, error)
	ListTemplates(ctx context.Context, teamID string) ([]store.TemplateRow, error)
	DeleteTemplate(ctx context.Context, teamID, name string) (string, error)
	TemplateDigests(ctx context.Context) (map[string]bool, error)
	DigestInUse(ctx context.Context, digest string) (bool, error)
	CountRunningByTemplate(ctx context.Context, teamID, name string) (int, error)
	PutTag(ctx context.Context, t store.TagRow) (string, error)
	GetTag(ctx context.Context, teamID, template, tag string) (store.TagRow, error)
	ListTags(ctx context.Context, teamID, template string) ([]store.TagRow, error)
	DeleteTag(ctx context.Context, teamID, template, tag string) (string, error)
	InsertBuild(ctx context.Context, teamID string, b client.TemplateBuild) (client.TemplateBuild, error)
	UpdateBuild(ctx context.Context, b client.TemplateBuild) error
	GetBuild(ctx context.Context, teamID, id string) (client.TemplateBuild, error)
	ListBuildsByState(ctx context.Context, states ...string) ([]store.BuildRef, error)
	GetSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error)
}

// SnapshotFiles opens a snapshot's files as an archive of a copy-on-write
// layer (node.Node.OpenSnapshotFiles), queueing for host capacity up to
// wait when that takes a sandbox.
type SnapshotFiles interface {
	OpenSnapshotFiles(ctx context.Context, snapshotID string, wait time.Duration) (io.ReadCloser, error)
}

// Importer turns an OCI image into a root filesystem (internal/template/oci).
type Importer interface {
	// Import reads a docker-archive tarball, an OCI layout as a tar, or an
	// OCI layout directory at src; ref picks an image when it holds several.
	// charge is told the size of each file before it is written; its error
	// stops the import, wrapped.
	Import(ctx context.Context, src, ref, dst string, charge func(int64) error) (template.ImageConfig, string, error)
	// ImportRemote pulls ref from its registry.
	ImportRemote(ctx context.Context, ref, dst string, charge func(int64) error) (template.ImageConfig, string, error)
	// CheckRemote refuses, before anything is fetched, a reference the
	// server may not pull (not an allowed registry, or a non-public
	// address); its error says why.
	CheckRemote(ref string) error
}

// Config configures the catalog.
type Config struct {
	// MaxBuildsPerTeam builds of one team run at once; more wait in a
	// FIFO queue. MaxBuilds bounds the builds of all teams.
	MaxBuildsPerTeam int
	MaxBuilds        int
	// BuildTimeout bounds one build (queueing excluded).
	BuildTimeout time.Duration
	// MaxContextBytes bounds a build context; MaxImportBytes an image
	// upload.
	MaxContextBytes int64
	MaxImportBytes  int64
	// BuildNetwork is the most network a build's run steps get: outbound
	// (the default: specs choose, outbound unless they say none) or none.
	BuildNetwork string
	// Mirror is the Debian mirror of built-ins built on first use.
	Mirror string
	// Maxima of a template's default shape.
	MaxCPU      float64
	MaxMemoryMB int
	MaxDiskMB   int
	// LogDir holds the build logs; MaxLogBytes bounds one.
	LogDir      string
	MaxLogBytes int64
	// Snapshots opens the files of the snapshots a build may start from
	// (from: snapshot:ID); nil: builds from snapshots are refused.
	Snapshots SnapshotFiles
	// Storage accounts for what teams store (nil: no limit): an upload or
	// a build context holds its bytes while it is processed, an import or
	// a build the files it writes, and a template, once stored, the bytes
	// it adds to the built-ins (template.StorageBytes), once per digest per
	// team. StoredBytes is the source of the templates' part.
	Storage *quota.Storage
}

func (c *Config) setDefaults() {
	if c.MaxBuildsPerTeam == 0 {
		c.MaxBuildsPerTeam = 2
	}
	if c.MaxBuilds == 0 {
		c.MaxBuilds = 2
	}
	if c.BuildTimeout == 0 {
		c.BuildTimeout = 30 * time.Minute
	}
	if c.MaxContextBytes == 0 {
		c.MaxContextBytes = 4 << 30
	}
	if c.MaxImportBytes == 0 {
		c.MaxImportBytes = 8 << 30
	}
	if c.BuildNetwork == "" {
		c.BuildNetwork = client.NetworkOutbound
	}
	if c.MaxCPU == 0 {
		c.MaxCPU = 8
	}
	if c.MaxMemoryMB == 0 {
		c.MaxMemoryMB = 8192
	}
	if c.MaxDiskMB == 0 {
		c.MaxDiskMB = 10240
	}
	if c.MaxLogBytes == 0 {
		c.MaxLogBytes = 16 << 20
	}
	if c.Storage == nil {
		c.Storage = quota.NewStorage(func(context.Context, string) (int64, error) { return 0, nil })
	}
}

// Service is the template catalog.
type Service struct {
	cfg     Config
	store   Store
	reg     *template.Registry
	builder *template.Builder
	oci     Importer
	log     *slog.Logger

	teamSlots *quota.Limiter // per team
	allSlots  *quota.Limiter // one "team": the server
	m         *metrics       // metrics.go

	ctx    context.Context // builds run under it; Close cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	active  map[string]*activeBuild // queued or running, by build id
	pending map[buildKey]string     // → build id of an active build
	pins    map[string]int          // digests a create or build is using
	closed  bool
}

// New returns the catalog. reg must have a store (UseStore). Call Recover
// once before serving and Close at shutdown.
func New(cfg Config, st Store, reg *template.Registry, runner template.Runner, importer Importer, log *slog.Logger) (*Service, error) {
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	if reg.StoreDir() == "" {
		return nil, errors.New("catalog: the template registry has no store")
	}
	if cfg.LogDir == "" {
		cfg.LogDir = filepath.Join(reg.StoreDir(), "logs")
	}
	if err := os.MkdirAll(cfg.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{
		cfg: cfg, store: st, reg: reg, builder: template.NewBuilder(reg, runner, log), oci: importer, log: log,
		teamSlots: quota.NewLimiter(), allSlots: quota.NewLimiter(), m: newMetrics(),
		ctx: ctx, cancel: cancel,
		active: map[string]*activeBuild{}, pending: map[buildKey]string{}, pins: map[string]int{},
	}, nil
}

// Recover records the builds an earlier process left queued or running as
// failed, and removes stored templates and layers nothing refers to.
func (s *Service) Recover(ctx context.Context) error {
	refs, err := s.store.ListBuildsByState(ctx, client.BuildStateQueued, client.BuildStateRunning)
	if err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	now := time.Now().UTC()
	for _, r := range refs {
		b := r.Build
		b.State, b.Error, b.FinishedAt = client.BuildStateFailed, "the server stopped during the build (it was not resumed when the server restarted)", &now
		if err := s.store.UpdateBuild(ctx, b); err != nil {
			return fmt.Errorf("catalog: %w", err)
		}
	}
	keep, err := s.store.TemplateDigests(ctx)
	if err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	stored, err := s.reg.Stored()
	if err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	for _, d := range stored {
		if keep[d] {
			continue
		}
		if inUse, err := s.store.DigestInUse(ctx, d); err != nil || inUse {
			continue
		}
		if err := s.reg.RemoveStored(d); err != nil {
			return fmt.Errorf("catalog: %w", err)
		}
		s.log.Info("removed unused template", "digest", d)
	}
	if n, err := s.reg.PruneLayers(); err != nil {
		return fmt.Errorf("catalog: %w", err)
	} else if n > 0 {
		s.log.Info("removed unused layers", "count", n)
	}
	return nil
}

// Close stops accepting builds, cancels the ones queued or running (they
// are recorded as failed) and waits for them to clean up.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

func errorf(code, format string, a ...any) *apierr.Error {
	return &apierr.Error{Code: code, Message: fmt.Sprintf(format, a...)}
}

// Acquire resolves a team's template for a new sandbox or a build and
// keeps its files until release is called (a delete of the name meanwhile
// removes the name only): a built-in (built now if it never was), or one
// of the team's own, by name, "name:tag" or "name:<build id>". teamID ""
// resolves built-ins only.
func (s *Service) Acquire(ctx context.Context, teamID, ref string) (*template.Template, func(), error) {
	if name, tag := template.SplitRef(ref); template.IsBuiltin(name) {
		if tag != template.DefaultTag {
			return nil, nil, notFound(name, tag)
		}
		t, err := s.reg.Get(name)
		if errors.Is(err, template.ErrNotFound) {
			// Built on first use.
			t, err = s.reg.EnsureBuiltin(ctx, name, s.cfg.Mirror, nil)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("catalog: built-in %s: %w", name, err)
		}
		return t, func() {}, nil
	}
	p, err := s.resolve(ctx, teamID, ref)
	if err != nil {
		return nil, nil, err
	}
	// Pin first: collect detaches a digest only while it holds s.mu and
	// sees no pin, so after this either the files stay, or Get misses them.
	release := s.pin(p.digest)
	t, err := s.reg.Get(p.digest)
	if err != nil {
		release()
		if errors.Is(err, template.ErrNotFound) {
			return nil, nil, notFound(p.name, p.tag)
		}
		return nil, nil, err
	}
	return t, release, nil
}

// pin keeps a stored template's files until the returned func is called.
func (s *Service) pin(digest string) func() {
	s.mu.Lock()
	s.pins[digest]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.pins[digest]--; s.pins[digest] <= 0 {
				delete(s.pins, digest)
			}
			s.mu.Unlock()
		})
	}
}

// collect removes the stored template digest if nothing uses it any more:
// no name of any team, no running sandbox, no create or build in flight.
// The check and the detach hold s.mu (a pin waits for them); the files are
// deleted after.
func (s *Service) collect(ctx context.Context, digest string) {
	if digest == "" {
		return
	}
	s.mu.Lock()
	if s.pins[digest] > 0 {
		s.mu.Unlock()
		return
	}
	inUse, err := s.store.DigestInUse(ctx, digest)
	if err != nil || inUse {
		s.mu.Unlock()
		return
	}
	remove, err := s.reg.DetachStored(digest)
	s.mu.Unlock()
	if err == nil {
		err = remove()
	}
	if err != nil {
		s.log.Error("remove unused template", "digest", digest, "err", err)
		return
	}
	s.log.Info("removed unused template", "digest", digest)
}

// StoredBytes is what a team's templates count against its storage limit:
// template.StorageBytes of each digest its names and tags point at, once.
func (s *Service) StoredBytes(ctx context.Context, teamID string) (int64, error) {
	digests, err := s.teamDigests(ctx, teamID)
	if err != nil {
		return 0, err
	}
	var n int64
	for d := range digests {
		t, err := s.reg.Get(d)
		if err != nil {
			// Its files are gone (they count nothing).
			continue
		}
		n += template.StorageBytes(t)
	}
	return n, nil
}

// reserve holds n bytes of the team's storage for a request.
func (s *Service) reserve(ctx context.Context, teamID string, n int64) (*quota.Reservation, error) {
	res, err := s.cfg.Storage.Reserve(ctx, teamID, n)
	if err != nil {
		return nil, storageError(err)
	}
	return res, nil
}

// storageError maps a storage quota error to its API error.
func storageError(err error) error {
	var se *quota.StorageError
	if errors.As(err, &se) {
		return errorf(client.CodeStorageQuotaExceeded, "%v (templates, uploads and build contexts being processed, eval inputs); delete templates or eval runs, or ask an admin to raise the team's max_storage_mb", se)
	}
	return err
}

// apiTemplate is the wire form of a template under a name.
func apiTemplate(name string, t *template.Template, buildID string) client.Template {
	src := t.Source
	if src == "" {
		src = template.SourceBuiltin
	}
	return client.Template{
		Name: name, Digest: t.Digest, SizeBytes: t.SizeBytes, StorageBytes: template.StorageBytes(t), BuiltAt: t.BuiltAt,
		CPU: t.Defaults.CPU, MemoryMB: t.Defaults.MemoryMB, DiskMB: t.Defaults.DiskMB,
		Workdir: t.Defaults.Workdir, User: t.Defaults.User, Source: src, Env: t.Defaults.Env,
		StartCmd: t.Defaults.StartCmd, ReadyCmd: t.Defaults.ReadyCmd, From: t.From, Layers: t.Layers, Cmd: t.Cmd, BuildID: buildID,
	}
}

// List returns the built-ins and the team's templates, by name (a tag
// "name:tag" after its name), and the disk the template store uses.
func (s *Service) List(ctx context.Context, teamID string) (client.TemplateList, error) {
	out := client.TemplateList{Templates: []client.Template{}}
	builtins, err := s.reg.List()
	if err != nil {
		return out, err
	}
	for _, t := range builtins {
		if template.IsBuiltin(t.Name) {
			out.Templates = append(out.Templates, apiTemplate(t.Name, t, ""))
		}
	}
	rows, err := s.store.ListTemplates(ctx, teamID)
	if err != nil {
		return out, err
	}
	tags, err := s.store.ListTags(ctx, teamID, "")
	if err != nil {
		return out, err
	}
	for _, tr := range tags {
		rows = append(rows, store.TemplateRow{Name: tr.Template + ":" + tr.Tag, Digest: tr.Digest, BuildID: tr.BuildID})
	}
	slices.SortStableFunc(rows, func(a, b store.TemplateRow) int { return strings.Compare(a.Name, b.Name) })
	for _, r := range rows {
		t, err := s.reg.Get(r.Digest)
		if err != nil {
			s.log.Error("template of a name is missing", "team", teamID, "template", r.Name, "digest", r.Digest, "err", err)
			continue
		}
		out.Templates = append(out.Templates, apiTemplate(r.Name, t, r.BuildID))
	}
	if out.DiskUsageBytes, err = s.reg.DiskUsage(); err != nil {
		return out, err
	}
	return out, nil
}

// Get returns one template of the team (or a built-in), by name or
// "name:tag".
func (s *Service) Get(ctx context.Context, teamID, ref string) (client.Template, error) {
	if name, tag := template.SplitRef(ref); template.IsBuiltin(name) {
		if tag != template.DefaultTag {
			return client.Template{}, notFound(name, tag)
		}
		t, err := s.reg.Get(name)
		if errors.Is(err, template.ErrNotFound) {
			return client.Template{}, errorf(client.CodeNotFound, "built-in template %q is not built yet (it is built on first use, or by `evalbox template init`)", name)
		}
		if err != nil {
			return client.Template{}, err
		}
		return apiTemplate(name, t, ""), nil
	}
	p, err := s.resolve(ctx, teamID, ref)
	if err != nil {
		return client.Template{}, err
	}
	t, err := s.reg.Get(p.digest)
	if err != nil {
		return client.Template{}, err
	}
	return apiTemplate(ref, t, p.buildID), nil
}

// Delete removes the team's template name with all its tags ("name:tag":
// that tag only, as Untag), and its files once nothing else uses them.
// Built-ins cannot be deleted (forbidden); a template that running
// sandboxes use, or that is being built, is a conflict.
func (s *Service) Delete(ctx context.Context, teamID, ref string) error {
	name, tag := template.SplitRef(ref)
	if template.IsBuiltin(name) {
		return errorf(client.CodeForbidden, "%s is a built-in template: it cannot be deleted (`evalbox template init` rebuilds built-ins)", name)
	}
	if strings.Contains(ref, ":") {
		return s.Untag(ctx, teamID, name, []string{tag})
	}
	s.mu.Lock()
	var id string
	for k, v := range s.pending {
		if k.team == teamID && k.name == name {
			id = v
		}
	}
	s.mu.Unlock()
	if id != "" {
		return errorf(client.CodeConflict, "template %s is being built (build %s); wait for it to end", name, id)
	}
	tags, err := s.Tags(ctx, teamID, name)
	if err != nil {
		return err
	}
	n, err := s.store.CountRunningByTemplate(ctx, teamID, name)
	if err != nil {
		return err
	}
	if n > 0 {
		return errorf(client.CodeConflict, "template %s is used by %d running sandbox(es); delete them first", name, n)
	}
	var digests []string
	for _, t := range tags {
		var d string
		if t.Tag == template.DefaultTag {
			d, err = s.store.DeleteTemplate(ctx, teamID, name)
		} else {
			d, err = s.store.DeleteTag(ctx, teamID, name, t.Tag)
		}
		if errors.Is(err, store.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		digests = append(digests, d)
	}
	if len(digests) == 0 {
		return errorf(client.CodeNotFound, "template %q not found", name)
	}
	s.log.Info("template deleted", "team", teamID, "template", name, "tags", len(tags))
	for _, d := range slices.Compact(slices.Sorted(slices.Values(digests))) {
		s.collect(ctx, d)
	}
	return nil
}

// checkName checks the name of a template to build or import.
func checkName(name string) error {
	if !template.ValidName(name) {
		return errorf(client.CodeBadRequest, "name %q is not a valid template name (1–63 of a-z 0-9 . _ -, starting with a letter or digit)", name)
	}
	if template.IsBuiltin(name) {
		return errorf(client.CodeBadRequest, "%s is a built-in template; choose another name", name)
	}
	if template.ReservedName(name) {
		return errorf(client.CodeBadRequest, "%s is a reserved name (from: snapshot:ID names a snapshot); choose another name", name)
	}
	return nil
}

// logPath is where build id's log is kept.
func (s *Service) logPath(id string) string { return filepath.Join(s.cfg.LogDir, id+".log") }

// storeless hides host paths of the store in messages shown to users.
func (s *Service) storeless(msg string) string {
	return strings.ReplaceAll(msg, s.reg.StoreDir()+"/", "")
}
