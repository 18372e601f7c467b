package catalog

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// activeBuild is a build that is queued or running: its log, and the
// signal its log followers wait on.
type activeBuild struct {
	id, teamID, name string
	tags             []string // what the build names when it succeeds
	key              buildKey // in Service.pending
	max              int64
	// res holds the team's storage for the build's uploads and files,
	// until the template is stored (Persist) or the build ends.
	res *quota.Reservation

	mu        sync.Mutex
	f         *os.File
	size      int64
	truncated bool
	changed   chan struct{} // closed (and replaced) on every write and at the end
	done      bool
}

// Write appends to the build log and wakes its followers. Past the log's
// maximum, output is dropped (once noted in the log).
func (a *activeBuild) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done {
		return len(p), nil
	}
	if a.size+int64(len(p)) > a.max {
		if !a.truncated {
			a.truncated = true
			n, _ := a.f.WriteString("\n[log truncated: over the maximum of the build log]\n")
			a.size += int64(n)
			a.wake()
		}
		return len(p), nil
	}
	n, err := a.f.Write(p)
	a.size += int64(n)
	a.wake()
	if err != nil {
		return n, err
	}
	return len(p), nil
}

func (a *activeBuild) logf(format string, args ...any) {
	fmt.Fprintf(a, format+"\n", args...)
}

// wake signals followers; a.mu is held.
func (a *activeBuild) wake() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// wait returns the channel closed at the next write, or nil once the build
// is over.
func (a *activeBuild) wait() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done {
		return nil
	}
	return a.changed
}

// finish closes the log and releases its followers.
func (a *activeBuild) finish() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done = true
	close(a.changed)
	a.f.Close()
}

// job is the work of one build or import, run once it is admitted.
type job func(ctx context.Context, a *activeBuild, b *client.TemplateBuild) (*template.Template, error)

// begin registers a new build of (team, name): a conflict if one is
// active. The caller calls start or abandon.
func (s *Service) begin(teamID, name, kind string, steps int, opts BuildOptions) (*client.TemplateBuild, *activeBuild, error) {
	tags, err := checkTags(opts.Tags)
	if err != nil {
		return nil, nil, err
	}
	id := opts.ID
	if id == "" {
		id = store.NewID("bld")
	} else if _, ok := store.IDBytes("bld", id); !ok {
		return nil, nil, fmt.Errorf("catalog: build id %q is not one NewBuildID made", id)
	}
	b := &client.TemplateBuild{ID: id, Template: name, Kind: kind, State: client.BuildStateQueued,
		Steps: steps, CreatedAt: time.Now().UTC()}
	f, err := os.OpenFile(s.logPath(b.ID), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, nil, errorf(client.CodeConflict, "build %s exists already", b.ID)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("catalog: build log: %w", err)
	}
	key := buildKey{teamID, name, strings.Join(tags, ",")}
	a := &activeBuild{id: b.ID, teamID: teamID, name: name, tags: tags, key: key, max: s.cfg.MaxLogBytes, f: f, changed: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		f.Close()
		os.Remove(s.logPath(b.ID))
		return nil, nil, errorf(client.CodeUnavailable, "the server is shutting down")
	}
	if other, ok := s.pending[key]; ok {
		f.Close()
		os.Remove(s.logPath(b.ID))
		return nil, nil, errorf(client.CodeConflict, "template %s is being built already (build %s)", refOf(name, tags), other)
	}
	s.pending[key] = b.ID
	s.active[b.ID] = a
	return b, a, nil
}

// abandon undoes begin for a build refused before it was recorded.
func (s *Service) abandon(a *activeBuild) {
	s.mu.Lock()
	delete(s.pending, a.key)
	delete(s.active, a.id)
	s.mu.Unlock()
	a.finish()
	os.Remove(s.logPath(a.id))
}

// start records the build and runs it in the background: it waits for a
// slot (the team's, then the server's), runs work under the build timeout,
// points the name at the result and records the outcome. cleanup runs
// after the build in every case.
func (s *Service) start(ctx context.Context, b *client.TemplateBuild, a *activeBuild, work job, cleanup func()) (client.TemplateBuild, error) {
	row, err := s.store.InsertBuild(ctx, a.teamID, *b)
	if err != nil {
		cleanup()
		s.abandon(a)
		return client.TemplateBuild{}, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cleanup()
		s.run(row, a, work)
	}()
	return row, nil
}

func (s *Service) run(b client.TemplateBuild, a *activeBuild, work job) {
	ctx := s.ctx
	defer s.observeBuild(&b)
	defer func() {
		s.mu.Lock()
		delete(s.pending, a.key)
		delete(s.active, a.id)
		s.mu.Unlock()
		a.finish()
	}()
	fail := func(msg string, step int) {
		now := time.Now().UTC()
		b.State, b.Error, b.FailedStep, b.FinishedAt = client.BuildStateFailed, msg, step, &now
		a.logf("build failed: %s", msg)
		if err := s.store.UpdateBuild(context.WithoutCancel(ctx), b); err != nil {
			s.log.Error("record build", "build", b.ID, "err", err)
		}
		s.log.Info("template build failed", "build", b.ID, "team", a.teamID, "template", a.name, "step", step)
	}
	if s.teamSlots.Waiting(a.teamID) > 0 || s.teamSlots.InUse(a.teamID) >= s.cfg.MaxBuildsPerTeam {
		a.logf("queued: the team runs %d build(s) at once", s.cfg.MaxBuildsPerTeam)
	}
	releaseTeam, err := s.teamSlots.Acquire(ctx, a.teamID, s.cfg.MaxBuildsPerTeam, -1)
	if err != nil {
		fail("the server shut down before the build started", 0)
		return
	}
	defer releaseTeam()
	releaseAll, err := s.allSlots.Acquire(ctx, "", s.cfg.MaxBuilds, -1)
	if err != nil {
		fail("the server shut down before the build started", 0)
		return
	}
	defer releaseAll()
	now := time.Now().UTC()
	b.State, b.StartedAt = client.BuildStateRunning, &now
	if err := s.store.UpdateBuild(ctx, b); err != nil {
		fail("internal error (the server log has the detail)", 0)
		s.log.Error("record build", "build", b.ID, "err", err)
		return
	}
	s.log.Info("template build started", "build", b.ID, "team", a.teamID, "template", a.name, "kind", b.Kind)
	bctx, cancel := context.WithTimeout(ctx, s.cfg.BuildTimeout)
	t, err := work(bctx, a, &b)
	cancel()
	if err != nil {
		var se *template.StepError
		switch {
		case ctx.Err() != nil:
			fail("the server shut down during the build", 0)
		case errors.Is(bctx.Err(), context.DeadlineExceeded):
			fail(fmt.Sprintf("the build timed out after %s", s.cfg.BuildTimeout), stepOf(err))
		case errors.As(err, &se):
			fail(s.storeless(se.Error()), se.Step)
		default:
			if !errors.Is(err, errUser) && !errors.Is(err, errContext) {
				s.log.Error("template build", "build", b.ID, "err", err)
			}
			fail(s.storeless(err.Error()), 0)
		}
		return
	}
	var olds []string
	err = s.persist(context.WithoutCancel(ctx), a, t, func() error {
		var err error
		olds, err = s.name(context.WithoutCancel(ctx), a.teamID, a.name, a.tags, t, b.ID)
		return err
	})
	var qe *quota.StorageError
	if errors.As(err, &qe) {
		fail(storageError(err).Error(), 0)
		s.collect(context.WithoutCancel(ctx), t.Digest)
		return
	}
	if err != nil {
		s.log.Error("record template", "build", b.ID, "err", err)
		fail("internal error (the server log has the detail)", 0)
		s.collect(context.WithoutCancel(ctx), t.Digest)
		return
	}
	for _, old := range olds {
		if old != t.Digest {
			s.collect(context.WithoutCancel(ctx), old)
		}
	}
	done := time.Now().UTC()
	b.State, b.Digest, b.FinishedAt = client.BuildStateSucceeded, t.Digest, &done
	a.logf("template %s: %s", refOf(a.name, a.tags), t.Digest)
	if err := s.store.UpdateBuild(context.WithoutCancel(ctx), b); err != nil {
		s.log.Error("record build", "build", b.ID, "err", err)
	}
	s.log.Info("template built", "build", b.ID, "team", a.teamID, "template", a.name, "digest", t.Digest,
		"cached_steps", b.CachedSteps, "built_steps", b.BuiltSteps, "duration", done.Sub(*b.StartedAt).Round(time.Millisecond))
}

// persist records the template t of build a with write, counting it
// against the team's storage in place of what the build held: the bytes
// it adds to the built-ins, nothing when the team names its digest
// already.
func (s *Service) persist(ctx context.Context, a *activeBuild, t *template.Template, write func() error) error {
	charge := template.StorageBytes(t)
	digests, err := s.teamDigests(ctx, a.teamID)
	if err != nil {
		return err
	}
	if digests[t.Digest] {
		charge = 0
	}
	return a.res.Persist(charge, write)
}

func stepOf(err error) int {
	var se *template.StepError
	if errors.As(err, &se) {
		return se.Step
	}
	return 0
}

// errUser and errContext mark errors caused by the user's input (an
// image, a build context), not the server: they are not logged as the
// server's.
var (
	errUser    = errors.New("importing the image")
	errContext = errors.New("build context")
)

// Build starts a build of spec as the team's template name, with the
// build context read from contextTar (nil: none). It checks everything it
// can before answering — the name, the spec, the template it starts from,
// the context and its copy sources — and returns the queued build; the
// build itself runs in the background (FollowLog streams its log).
func (s *Service) Build(ctx context.Context, teamID, name string, spec client.TemplateSpec, contextTar io.Reader, opts BuildOptions) (client.TemplateBuild, error) {
	if err := checkName(name); err != nil {
		return client.TemplateBuild{}, err
	}
	if err := template.ValidateSpec(spec); err != nil {
		return client.TemplateBuild{}, errorf(client.CodeBadRequest, "%v", err)
	}
	if spec.CPU > s.cfg.MaxCPU || spec.MemoryMB > s.cfg.MaxMemoryMB || spec.DiskMB > s.cfg.MaxDiskMB {
		return client.TemplateBuild{}, errorf(client.CodeBadRequest, "cpu, memory_mb and disk_mb may be at most %g, %d and %d",
			s.cfg.MaxCPU, s.cfg.MaxMemoryMB, s.cfg.MaxDiskMB)
	}
	network := spec.Network
	if network == "" {
		network = s.cfg.BuildNetwork
	}
	if network == client.NetworkOutbound && s.cfg.BuildNetwork == client.NetworkNone {
		return client.TemplateBuild{}, errorf(client.CodeBadRequest, "this server runs builds without network (network: none)")
	}
	if tags, err := checkTags(opts.Tags); err != nil {
		return client.TemplateBuild{}, err
	} else if err := s.tagRoom(ctx, teamID, name, tags); err != nil {
		return client.TemplateBuild{}, err
	}
	from, fromLayer, release, err := s.acquireFrom(ctx, teamID, spec.From)
	if err != nil {
		return client.TemplateBuild{}, err
	}
	// A team at its storage limit is refused before anything is kept.
	res, err := s.reserve(ctx, teamID, 0)
	if err != nil {
		release()
		return client.TemplateBuild{}, err
	}
	b, a, err := s.begin(teamID, name, client.BuildKindBuild, len(spec.Steps), opts)
	if err != nil {
		res.Release()
		release()
		return client.TemplateBuild{}, err
	}
	a.res = res
	work, err := s.reg.NewWorkDir(b.ID + "-context-")
	if err != nil {
		res.Release()
		release()
		s.abandon(a)
		return client.TemplateBuild{}, err
	}
	cleanup := func() {
		release()
		if err := os.RemoveAll(work); err != nil {
			s.log.Error("remove build context", "dir", work, "err", err)
		}
		res.Release()
	}
	lim := template.ContextLimits{MaxBytes: s.cfg.MaxContextBytes, Charge: res.Grow}
	// The context is kept as the client sent it, checked as it streams in,
	// and unpacked only once the build has its slots: what builds waiting
	// in the queue hold is their archives.
	ctxTar := ""
	if contextTar != nil {
		ctxTar = filepath.Join(work, "context.tar")
		if err := saveContext(contextTar, ctxTar, spec, lim, res); err != nil {
			cleanup()
			s.abandon(a)
			var ce *template.ContextError
			var spe *template.SpecError
			var qe *quota.StorageError
			switch {
			case errors.As(err, &qe):
				return client.TemplateBuild{}, storageError(err)
			case errors.As(err, &ce) && ce.TooLarge:
				return client.TemplateBuild{}, errorf(client.CodePayloadTooLarge, "%s", ce.Msg)
			case errors.As(err, &ce):
				return client.TemplateBuild{}, errorf(client.CodeBadRequest, "%s", ce.Msg)
			case errors.As(err, &spe):
				return client.TemplateBuild{}, errorf(client.CodeBadRequest, "%s", spe.Msg)
			}
			return client.TemplateBuild{}, err
		}
	} else if err := template.CheckContext(spec, ""); err != nil {
		cleanup()
		s.abandon(a)
		return client.TemplateBuild{}, errorf(client.CodeBadRequest, "%v", err)
	}
	return s.start(ctx, b, a, func(ctx context.Context, a *activeBuild, b *client.TemplateBuild) (*template.Template, error) {
		ctxDir := ""
		if ctxTar != "" {
			ctxDir = filepath.Join(work, "context")
			if err := unpackContext(ctxTar, ctxDir, spec, lim, res); err != nil {
				return nil, err
			}
		}
		out, err := s.builder.Build(ctx, template.BuildRequest{ID: b.ID, TeamID: teamID, Name: name, Spec: spec, From: from,
			FromLayer: fromLayer, Cmd: opts.Cmd, ContextDir: ctxDir, Network: network, Log: a, Charge: res.Grow})
		b.CachedSteps, b.BuiltSteps = out.Cached, out.Built
		return out.Template, err
	}, cleanup)
}

// quotaWriter writes to w what the team's storage can hold, holding it in
// res (beyond the first prepaid bytes, held already).
type quotaWriter struct {
	w       io.Writer
	res     *quota.Reservation
	prepaid int64
}

func (q *quotaWriter) Write(p []byte) (int, error) {
	n := int64(len(p))
	if q.prepaid >= n {
		q.prepaid -= n
	} else {
		if err := q.res.Grow(n - q.prepaid); err != nil {
			return 0, err
		}
		q.prepaid = 0
	}
	return q.w.Write(p)
}

// saveContext writes the build context read from r to the file p while
// checking it (template.ScanContext), holding its bytes in res.
func saveContext(r io.Reader, p string, spec client.TemplateSpec, lim template.ContextLimits, res *quota.Reservation) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = template.ScanContext(r, &quotaWriter{w: f, res: res}, spec, lim)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// unpackContext unpacks the saved build context p into dir (made) and
// checks the copy sources of spec in it; p is removed, and what it held of
// res given back (the unpacked files are held in its place, through
// lim.Charge).
func unpackContext(p, dir string, spec client.TemplateSpec, lim template.ContextLimits, res *quota.Reservation) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	err = template.ExtractContext(f, dir, lim)
	fi, serr := f.Stat()
	f.Close()
	var ce *template.ContextError
	var qe *quota.StorageError
	switch {
	case errors.As(err, &ce):
		return fmt.Errorf("%w: %s", errContext, strings.TrimPrefix(ce.Msg, "build context: "))
	case errors.As(err, &qe):
		return fmt.Errorf("%w: %s", errContext, storageError(err).Error())
	case err != nil:
		return err
	case serr != nil:
		return serr
	}
	if err := os.Remove(p); err != nil {
		return err
	}
	res.Shrink(fi.Size())
	if err := template.CheckContext(spec, dir); err != nil {
		return fmt.Errorf("%w: %v", errContext, err)
	}
	return nil
}

// acquireFrom resolves a spec's from and pins what it resolved to until
// release: a template (Acquire), or, for snapshot:ID, one of the team's
// snapshots: its template, and its files as the build's first layer.
func (s *Service) acquireFrom(ctx context.Context, teamID, ref string) (_ *template.Template, _ *template.FilesLayer, release func(), _ error) {
	id, ok := template.SnapshotRef(ref)
	if !ok {
		t, release, err := s.Acquire(ctx, teamID, ref)
		if isNotFound(err) {
			return nil, nil, nil, errorf(client.CodeBadRequest, "from: no template named %q (built-ins: base, python, node; or one of the team's)", ref)
		}
		return t, nil, release, err
	}
	if s.cfg.Snapshots == nil {
		return nil, nil, nil, errorf(client.CodeNotImplemented, "from: this server cannot build from snapshots")
	}
	sn, err := s.store.GetSnapshot(ctx, teamID, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, nil, errorf(client.CodeBadRequest, "from: the team has no snapshot %q", id)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	// The snapshot keeps its template's files (store.DigestInUse); the
	// pin keeps them through the build.
	release = s.pin(sn.TemplateDigest)
	t, err := s.reg.ByDigest(sn.TemplateDigest)
	if err != nil {
		release()
		if errors.Is(err, template.ErrNotFound) {
			return nil, nil, nil, errorf(client.CodeConflict, "from: the template of snapshot %s is gone from this server", id)
		}
		return nil, nil, nil, err
	}
	files := s.cfg.Snapshots
	layer := &template.FilesLayer{Key: "snapshot/" + sn.ID, Open: func(ctx context.Context) (io.ReadCloser, error) {
		return files.OpenSnapshotFiles(ctx, sn.ID, -1)
	}}
	return t, layer, release, nil
}

func isNotFound(err error) bool {
	var se *apierr.Error
	return errors.Is(err, template.ErrNotFound) || (errors.As(err, &se) && se.Code == client.CodeNotFound)
}

// Import starts importing an OCI image as the team's template name: from
// archive (a docker-archive tarball, or an OCI image layout as a tar
// archive; ref picks one image of several), or, with archive nil, from
// the registry reference image.
func (s *Service) Import(ctx context.Context, teamID, name, ref, image string, archive io.Reader, size int64) (client.TemplateBuild, error) {
	if err := checkName(name); err != nil {
		return client.TemplateBuild{}, err
	}
	if s.oci == nil {
		return client.TemplateBuild{}, errorf(client.CodeUnavailable, "this server cannot import images")
	}
	if (archive == nil) == (image == "") {
		return client.TemplateBuild{}, errorf(client.CodeBadRequest, "give either an image archive (the body) or a registry reference (image), not both")
	}
	if image != "" {
		if err := s.oci.CheckRemote(image); err != nil {
			return client.TemplateBuild{}, errorf(client.CodeBadRequest, "image %s: %s", image, strings.TrimPrefix(err.Error(), "oci: "))
		}
	}
	if archive == nil || size < 0 {
		size = 0
	}
	if size > s.cfg.MaxImportBytes {
		return client.TemplateBuild{}, errorf(client.CodePayloadTooLarge, "the image archive is over the maximum of %d bytes", s.cfg.MaxImportBytes)
	}
	// The upload's announced size is held before any of it is read: past
	// the team's storage limit, nothing is kept.
	res, err := s.reserve(ctx, teamID, size)
	if err != nil {
		return client.TemplateBuild{}, err
	}
	b, a, err := s.begin(teamID, name, client.BuildKindImport, 0, BuildOptions{})
	if err != nil {
		res.Release()
		return client.TemplateBuild{}, err
	}
	a.res = res
	work, err := s.reg.NewWorkDir(b.ID + "-import-")
	if err != nil {
		res.Release()
		s.abandon(a)
		return client.TemplateBuild{}, err
	}
	cleanup := func() {
		if err := os.RemoveAll(work); err != nil {
			s.log.Error("remove import", "dir", work, "err", err)
		}
		res.Release()
	}
	src := ""
	if archive != nil {
		if src, err = s.saveArchive(archive, work, res, size); err != nil {
			cleanup()
			s.abandon(a)
			return client.TemplateBuild{}, err
		}
	}
	from := image
	if from == "" {
		from = ref
	}
	return s.start(ctx, b, a, func(ctx context.Context, a *activeBuild, b *client.TemplateBuild) (*template.Template, error) {
		tdir := filepath.Join(work, "template")
		if err := os.Mkdir(tdir, 0o700); err != nil {
			return nil, err
		}
		var cfg template.ImageConfig
		var digest string
		var err error
		if image != "" {
			a.logf("pulling %s", image)
			cfg, digest, err = s.oci.ImportRemote(ctx, image, filepath.Join(tdir, "rootfs"), res.Grow)
		} else {
			a.logf("importing the uploaded image%s", map[bool]string{true: " " + ref, false: ""}[ref != ""])
			cfg, digest, err = s.oci.Import(ctx, src, ref, filepath.Join(tdir, "rootfs"), res.Grow)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.As(err, new(*quota.StorageError)) {
				return nil, fmt.Errorf("%w: %s", errUser, storageError(err).Error())
			}
			return nil, fmt.Errorf("%w: %s", errUser, s.storeless(err.Error()))
		}
		a.logf("image %s", digest)
		return s.reg.AddImport(tdir, name, from, digest, cfg, template.Builtins["base"].Defaults)
	}, cleanup)
}

// saveArchive stores an uploaded image archive in work, holding its
// bytes in res (the first prepaid of them held already), and returns its
// path. The archive (a docker-archive or an OCI layout) is never
// unpacked: the importer reads its members in place.
func (s *Service) saveArchive(archive io.Reader, work string, res *quota.Reservation, prepaid int64) (string, error) {
	p := filepath.Join(work, "image.tar")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	n, err := io.Copy(&quotaWriter{w: f, res: res, prepaid: prepaid}, io.LimitReader(archive, s.cfg.MaxImportBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if errors.As(err, new(*quota.StorageError)) {
		return "", storageError(err)
	}
	if err != nil {
		return "", err
	}
	if n > s.cfg.MaxImportBytes {
		return "", errorf(client.CodePayloadTooLarge, "the image archive is over the maximum of %d bytes", s.cfg.MaxImportBytes)
	}
	if _, err := archiveKind(p); err != nil {
		return "", errorf(client.CodeBadRequest, "image archive: %v", err)
	}
	return p, nil
}

// maxArchiveMembers bounds the members of an image archive (as the
// importer does).
const maxArchiveMembers = 100_000

// archiveKind tells a docker-archive (manifest.json) from an OCI layout
// (oci-layout) by the tar members at its root. Sparse members (which no
// image archive has) are refused.
func archiveKind(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	kind := ""
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("not a valid tar archive (%v)", err)
		}
		if n >= maxArchiveMembers {
			return "", fmt.Errorf("more than %d members: not an image archive", maxArchiveMembers)
		}
		if template.IsSparse(hdr) {
			return "", fmt.Errorf("%s is a sparse file: not an image archive", hdr.Name)
		}
		switch path.Clean(hdr.Name) {
		case "oci-layout":
			kind = "oci"
		case "manifest.json":
			if kind == "" {
				kind = "docker"
			}
		}
	}
	if kind == "" {
		return "", errors.New("neither a docker-archive tarball (no manifest.json) nor an OCI image layout (no oci-layout)")
	}
	return kind, nil
}

// GetBuild returns a build of the team's template name.
func (s *Service) GetBuild(ctx context.Context, teamID, name, id string) (client.TemplateBuild, error) {
	b, err := s.store.GetBuild(ctx, teamID, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && b.Template != name) {
		return client.TemplateBuild{}, errorf(client.CodeNotFound, "build %s of template %s not found", id, name)
	}
	return b, err
}

// OpenLog opens the log of a build of the team's template name as it is
// now (a running build's grows).
func (s *Service) OpenLog(ctx context.Context, teamID, name, id string) (io.ReadCloser, error) {
	if _, err := s.GetBuild(ctx, teamID, name, id); err != nil {
		return nil, err
	}
	f, err := os.Open(s.logPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(strings.NewReader("")), nil // queued: nothing written yet
	}
	return f, err
}

// MaxContextBytes is the largest build context a build takes.
func (s *Service) MaxContextBytes() int64 { return s.cfg.MaxContextBytes }

// FollowLog sends the log of a build to emit, from its start: all of it
// for a finished build, and as it is written for one that runs, until it
// ends. It returns the build as it ended.
func (s *Service) FollowLog(ctx context.Context, teamID, name, id string, emit func([]byte) error) (client.TemplateBuild, error) {
	if _, err := s.GetBuild(ctx, teamID, name, id); err != nil {
		return client.TemplateBuild{}, err
	}
	f, err := os.Open(s.logPath(id))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return client.TemplateBuild{}, err
	}
	if f != nil {
		defer f.Close()
	}
	buf := make([]byte, 32<<10)
	for {
		// Take the wake-up channel before reading: a write after the read
		// closes it.
		s.mu.Lock()
		a := s.active[id]
		s.mu.Unlock()
		var wake <-chan struct{}
		if a != nil {
			wake = a.wait()
		}
		for f != nil {
			n, err := f.Read(buf)
			if n > 0 {
				if err := emit(buf[:n]); err != nil {
					return client.TemplateBuild{}, err
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return client.TemplateBuild{}, err
			}
		}
		if wake == nil {
			// Over: the log is complete and the row final.
			return s.store.GetBuild(context.WithoutCancel(ctx), teamID, id)
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return client.TemplateBuild{}, ctx.Err()
		}
	}
}
