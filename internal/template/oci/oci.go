// Package oci imports OCI and Docker images as template root filesystems.
//
// The image side (docker-archive tarballs, OCI image layouts, registries,
// manifests, indexes, compression) is go-containerregistry's. Layers are
// applied here, in order, straight onto the destination directory (rather
// than through mutate.Extract's flattened stream) because that keeps what a
// flattened stream loses: hardlinks to files of lower layers and hardlinks
// whose target a later layer replaces keep the content overlayfs would show,
// relative symlinks that climb above the root are kept (a chroot clamps
// them), and extended attributes are restored. See applier for how paths are
// kept inside the destination.
package oci

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

var (
	// ErrInvalidImage is wrapped by errors about the image itself: not a
	// tarball or layout, truncated or corrupt, a missing manifest or blob,
	// content that does not match its digest, an entry that would escape the
	// destination, or an image for another platform.
	ErrInvalidImage = errors.New("invalid image")
	// ErrUnknownRef is wrapped when ref names no image of the source, or the
	// source holds several images and no ref chose one.
	ErrUnknownRef = errors.New("unknown image ref")
	// ErrTooLarge is wrapped when an image passes a bound of Limits (or of
	// the archive it came in).
	ErrTooLarge = errors.New("image too large")
)

// Config is what an image says about running it.
type Config struct {
	Env        []string // KEY=VALUE, in image order
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Limits bound what one import reads and writes; zero fields take the
// defaults.
type Limits struct {
	// MaxBytes bounds the uncompressed layers of the image, all together
	// (their tar streams: headers, padding, and what a gzip or zstd stream
	// expands to), and so the bytes of the files written. Default 32 GiB.
	MaxBytes int64
	// MaxEntries bounds the tar entries of all layers. Default 1,000,000.
	MaxEntries int
}

// Default limits.
const (
	DefaultMaxBytes   = 32 << 30
	DefaultMaxEntries = 1_000_000
)

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	return l
}

// Charge is told the size of each regular file before the file is
// written; an error stops the import, wrapped (a storage quota).
type Charge func(n int64) error

// Importer imports images within its limits. The zero value uses the
// default limits and pulls from registries on public addresses only.
type Importer struct {
	Limits Limits
	// AllowRegistries, when set, are the only registries ImportRemote
	// pulls from; they may be on loopback or private addresses (see
	// remote.go). Empty: any registry on a public address.
	AllowRegistries AllowList
	// HostCredentials makes pulls authenticate with the host's registry
	// credentials (the default keychain: ~/.docker/config.json and
	// helpers). Off, pulls are anonymous: a team's import must not use
	// what the operator is allowed to pull.
	HostCredentials bool
}

// Annotations naming an image in an OCI layout's index.json.
const (
	annotationRefName    = "org.opencontainers.image.ref.name"
	annotationContainerd = "io.containerd.image.name"
)

// Import is (&Importer{}).Import without a charge.
func Import(ctx context.Context, src, ref, dst string) (Config, string, error) {
	return (&Importer{}).Import(ctx, src, ref, dst, nil)
}

// Import reads the image at src — a docker-archive tarball (`docker save`
// format), an OCI image layout packed as a tar archive, or an OCI image
// layout directory (index.json; if it holds several manifests, ref selects
// one by the org.opencontainers.image.ref.name annotation, else it must
// hold exactly one) — and writes its flattened root filesystem into dst
// (must not exist; created; on any error nothing is left at dst). It
// returns the image config and the image's digest (manifest digest,
// "sha256:…"). charge (nil: none) is called before each file is written.
//
// The files of src are read in place, never extracted: a layout's files
// are opened beneath its directory without following symlinks, regular
// files only (source), an archive's members as sections of the archive;
// the files read whole (index.json, manifests, configs) are bounded.
//
// In a layout, ref may also be the io.containerd.image.name annotation (what
// `docker save` writes) or a manifest digest; in a docker-archive it is one
// of the image's RepoTags. When the chosen manifest is an index, the image for
// the host's platform (linux/amd64 on amd64 hosts) is taken and its digest is
// returned. A docker-archive holds no registry manifest: its digest is the one
// of the manifest go-containerregistry derives from it (what `crane push`
// would upload), which for an archive of uncompressed layers costs a gzip
// pass; it runs alongside the extraction.
//
// dst's parent must exist. The filesystem is written into a hidden sibling
// directory (".<base>.import-*") renamed to dst at the end; a crash can leave
// one behind.
func (im *Importer) Import(ctx context.Context, src, ref, dst string, charge Charge) (Config, string, error) {
	cfg, digest, err := im.importLocal(ctx, src, ref, dst, charge)
	if err != nil {
		return Config{}, "", fmt.Errorf("oci: %s: %w", src, cancelled(ctx, err))
	}
	return cfg, digest, nil
}

func (im *Importer) importLocal(ctx context.Context, src, ref, dst string, charge Charge) (Config, string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	img, closeSrc, err := openLocal(ctx, src, ref)
	if err != nil {
		return Config{}, "", err
	}
	defer closeSrc()
	return unpack(ctx, cancel, img, true, dst, im.Limits.withDefaults(), charge)
}

// ImportRemote is (&Importer{}).ImportRemote without a charge.
func ImportRemote(ctx context.Context, ref, dst string) (Config, string, error) {
	return (&Importer{}).ImportRemote(ctx, ref, dst, nil)
}

// ImportRemote does the same from a registry reference (e.g.
// "registry.example:5000/py:3.12"), anonymously unless im.HostCredentials
// is set; it is for
// hosts that reach a registry. Registries on localhost, loopback and private
// (RFC 1918) addresses are spoken to over plain HTTP, others over HTTPS.
// Only registries on public addresses are pulled from, and every
// connection of the pull is checked (remote.go), unless
// im.AllowRegistries allows the registry; errors never show what a
// registry answered (remoteError).
func (im *Importer) ImportRemote(ctx context.Context, ref, dst string, charge Charge) (Config, string, error) {
	cfg, digest, err := im.importRemote(ctx, ref, dst, charge)
	if err != nil {
		return Config{}, "", fmt.Errorf("oci: %s: %w", ref, cancelled(ctx, remoteError(err)))
	}
	return cfg, digest, nil
}

func (im *Importer) importRemote(ctx context.Context, ref, dst string, charge Charge) (Config, string, error) {
	if err := im.CheckRemote(ref); err != nil {
		return Config{}, "", err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return Config{}, "", fmt.Errorf("%w: %w", ErrUnknownRef, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	keychain := authn.Keychain(anonymous{})
	if im.HostCredentials {
		keychain = authn.DefaultKeychain
	}
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(keychain),
		remote.WithPlatform(hostPlatform()),
		remote.WithTransport(im.transport()))
	if err != nil {
		return Config{}, "", err
	}
	// The config is read whole: bound it by its descriptor first (the
	// registry's answer is then cut at that size).
	m, err := img.Manifest()
	if err != nil {
		return Config{}, "", err
	}
	if m.Config.Size < 0 || m.Config.Size > maxMetadataBytes {
		return Config{}, "", invalid("the config is %d bytes, over the maximum of %d for image metadata", m.Config.Size, maxMetadataBytes)
	}
	return unpack(ctx, cancel, img, false, dst, im.Limits.withDefaults(), charge)
}

// anonymous is a keychain that has no credentials for any registry.
type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

// cancelled reports ctx's error in place of err when ctx ended: whatever
// failed then failed because of it.
func cancelled(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return cerr
	}
	return err
}

func hostPlatform() v1.Platform { return v1.Platform{OS: "linux", Architecture: runtime.GOARCH} }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidImage}, args...)...)
}

// openLocal opens a tar archive (docker-archive or OCI layout) or an OCI
// layout directory; the returned func closes what it opened.
func openLocal(ctx context.Context, src, ref string) (v1.Image, func(), error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, nil, err
	}
	if st.IsDir() {
		ds, err := openDirSource(src)
		if err != nil {
			return nil, nil, err
		}
		img, err := openLayoutSource(ds, ref)
		if err != nil {
			ds.close()
			return nil, nil, err
		}
		return img, func() { ds.close() }, nil
	}
	if !st.Mode().IsRegular() {
		return nil, nil, invalid("neither a tarball nor an OCI layout directory")
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, nil, err
	}
	img, err := openArchive(ctx, f, src, ref)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return img, func() { f.Close() }, nil
}

// ctxFile is an *os.File whose reads stop once ctx is done. It seeks, so tar
// readers skip entries instead of reading them.
type ctxFile struct {
	ctx context.Context
	f   *os.File
}

func (c ctxFile) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.f.Read(p)
}

func (c ctxFile) Seek(off int64, whence int) (int64, error) { return c.f.Seek(off, whence) }
func (c ctxFile) Close() error                              { return c.f.Close() }

// corrupt tells a damaged archive from one that is just not an image.
func corrupt(err error) bool {
	var serr *json.SyntaxError
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) || errors.As(err, &serr)
}

// openArchive opens the archive f (at src): an OCI layout when it holds
// oci-layout (as `docker save` of Docker 25 and later writes, next to a
// manifest.json), else a docker-archive.
func openArchive(ctx context.Context, f *os.File, src, ref string) (v1.Image, error) {
	if err := checkHead(f); err != nil {
		return nil, err
	}
	ts, err := scanArchive(f)
	if err != nil {
		return nil, err
	}
	switch {
	case ts.has("oci-layout"):
		return openLayoutSource(ts, ref)
	case ts.has("manifest.json"):
		return openDockerArchive(ctx, ts, src, ref)
	}
	return nil, invalid("not a docker-archive tarball (no manifest.json) nor an OCI image layout (no oci-layout)")
}

// openDockerArchive reads a docker-archive with go-containerregistry's
// tarball package, which reads manifest.json and the config whole: their
// sizes are checked first, found as it finds them.
func openDockerArchive(ctx context.Context, ts *tarSource, src, ref string) (v1.Image, error) {
	opener := func() (io.ReadCloser, error) {
		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		return ctxFile{ctx, f}, nil
	}
	checkSize := func(name string) error {
		m, err := ts.resolve(name)
		if err != nil {
			return invalid("docker-archive: %w", err)
		}
		if m.size > maxMetadataBytes {
			return invalid("%s is %d bytes, over the maximum of %d for image metadata", name, m.size, maxMetadataBytes)
		}
		return nil
	}
	if err := checkSize("manifest.json"); err != nil {
		return nil, err
	}
	m, err := tarball.LoadManifest(opener)
	if corrupt(err) {
		return nil, invalid("truncated or corrupt tarball: %w", err)
	}
	if err != nil {
		return nil, invalid("not a docker-archive tarball (no readable manifest.json): %w", err)
	}
	for _, d := range m {
		if err := checkSize(d.Config); err != nil {
			return nil, err
		}
	}
	var tag *name.Tag
	switch {
	case ref != "":
		t, err := name.NewTag(ref)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnknownRef, err)
		}
		if !archiveHasTag(m, t) {
			return nil, fmt.Errorf("%w: %q is not in the archive (tags: %s)", ErrUnknownRef, ref, archiveTags(m))
		}
		tag = &t
	case len(m) != 1:
		return nil, fmt.Errorf("%w: the archive holds %d images (tags: %s); choose one with a ref", ErrUnknownRef, len(m), archiveTags(m))
	}
	img, err := tarball.Image(opener, tag)
	if corrupt(err) {
		return nil, invalid("truncated or corrupt tarball: %w", err)
	}
	if err != nil {
		return nil, invalid("docker-archive: %w", err)
	}
	return img, nil
}

// checkHead refuses a file that is no tar archive by its first block.
func checkHead(f *os.File) error {
	var head [512]byte
	n, err := f.ReadAt(head[:], 0)
	if err != nil && err != io.EOF {
		return err
	}
	if n >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		return invalid("a gzip-compressed file: decompress it (gunzip) and import the tarball")
	}
	if n < len(head) || !tarHeaderValid(head[:]) {
		return invalid("neither a tarball nor an OCI layout directory")
	}
	return nil
}

// tarHeaderValid checks the checksum of a tar header block: any tar format
// (V7, USTAR, PAX, GNU) has one, and random data almost never matches it.
func tarHeaderValid(b []byte) bool {
	var want int64
	for _, c := range b[148:156] {
		if c >= '0' && c <= '7' {
			want = want*8 + int64(c-'0')
		} else if c != ' ' && c != 0 {
			return false
		}
	}
	var sum int64
	for i, c := range b {
		if i >= 148 && i < 156 {
			c = ' '
		}
		sum += int64(c)
	}
	return sum == want && sum != 8*' '
}

func archiveHasTag(m tarball.Manifest, t name.Tag) bool {
	for _, d := range m {
		for _, s := range d.RepoTags {
			if rt, err := name.NewTag(s); err == nil && rt.Name() == t.Name() {
				return true
			}
		}
	}
	return false
}

func archiveTags(m tarball.Manifest) string {
	var tags []string
	for _, d := range m {
		tags = append(tags, d.RepoTags...)
	}
	if len(tags) == 0 {
		return "none"
	}
	return strings.Join(tags, ", ")
}

// pickPlatform chooses the host platform's manifest among descs.
func pickPlatform(descs []v1.Descriptor) (v1.Descriptor, error) {
	want := hostPlatform()
	for _, d := range descs {
		if d.Platform != nil && d.Platform.Satisfies(want) {
			return d, nil
		}
	}
	if len(descs) == 1 && descs[0].Platform == nil {
		return descs[0], nil
	}
	var have []string
	for _, d := range descs {
		if d.Platform != nil {
			have = append(have, d.Platform.String())
		} else {
			have = append(have, "unknown")
		}
	}
	return v1.Descriptor{}, invalid("no %s image in the index (platforms: %s)", want.String(), strings.Join(have, ", "))
}

// unpack writes img's root filesystem to dst. cancel cancels ctx, which
// img's reads watch. local says the layers come from a local file, so that
// an error reading them means the file is bad.
func unpack(ctx context.Context, cancel context.CancelFunc, img v1.Image, local bool, dst string, lim Limits, charge Charge) (Config, string, error) {
	start := time.Now()
	dst = filepath.Clean(dst)
	if _, err := os.Lstat(dst); err == nil {
		return Config{}, "", fmt.Errorf("destination %s: %w", dst, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Config{}, "", fmt.Errorf("destination: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Config{}, "", invalid("reading the image config: %w", err)
	}
	if (cf.OS != "" && cf.OS != "linux") || (cf.Architecture != "" && cf.Architecture != runtime.GOARCH) {
		return Config{}, "", invalid("the image is for %s/%s, this host runs %s", cf.OS, cf.Architecture, hostPlatform().String())
	}
	layers, err := img.Layers()
	if err != nil {
		return Config{}, "", invalid("listing layers: %w", err)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return Config{}, "", invalid("%d layers but the config lists %d diff ids", len(layers), len(cf.RootFS.DiffIDs))
	}

	// The digest may cost a pass over the layers (docker-archive): compute it
	// alongside; on error, stop it and wait for it.
	type result struct {
		h   v1.Hash
		err error
	}
	digestc := make(chan result, 1)
	go func() {
		h, err := img.Digest()
		digestc <- result{h, err}
	}()
	waited := false
	defer func() {
		if !waited {
			cancel()
			<-digestc
		}
	}()

	tmp, err := os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".import-")
	if err != nil {
		return Config{}, "", fmt.Errorf("destination: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Config{}, "", err
	}
	a, err := newApplier(tmp, &budget{lim: lim, charge: charge})
	if err != nil {
		return Config{}, "", err
	}
	defer a.close()
	for i, l := range layers {
		if err := applyLayer(ctx, a, l, cf.RootFS.DiffIDs[i], local); err != nil {
			return Config{}, "", fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
	}
	if err := a.finish(); err != nil {
		return Config{}, "", err
	}

	r := <-digestc
	waited = true
	if r.err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return Config{}, "", cerr
		}
		return Config{}, "", invalid("computing the image digest: %w", r.err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		if err == unix.EEXIST {
			return Config{}, "", fmt.Errorf("destination %s: %w", dst, fs.ErrExist)
		}
		return Config{}, "", &os.LinkError{Op: "rename", Old: tmp, New: dst, Err: err}
	}
	done = true
	if a.droppedDevices > 0 {
		slog.Debug("oci import: device nodes dropped", "dst", dst, "count", a.droppedDevices)
	}
	slog.Debug("oci import", "dst", dst, "layers", len(layers), "duration", time.Since(start))
	c := cf.Config
	return Config{Env: c.Env, Workdir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}, r.h.String(), nil
}

// applyLayer applies one layer, checking its content against its diff id.
func applyLayer(ctx context.Context, a *applier, l v1.Layer, diffID v1.Hash, local bool) error {
	rc, err := l.Uncompressed()
	if err != nil {
		if local {
			return invalid("opening: %w", err)
		}
		return fmt.Errorf("opening: %w", err)
	}
	defer rc.Close()
	lr := &layerReader{ctx: ctx, r: rc, h: sha256.New(), b: a.budget}
	ra := newReadAhead(lr, 1<<20, 4)
	err = a.apply(ctx, ra)
	if err == nil {
		// The tar's end may leave padding unread; the diff id covers it.
		_, err = io.CopyBuffer(io.Discard, onlyReader{ra}, a.buf)
	}
	ra.close() // lr is ours again
	if errors.Is(lr.err, ErrTooLarge) {
		return lr.err
	}
	if lr.err != nil && ctx.Err() == nil {
		if local || corrupt(lr.err) {
			return invalid("reading: %w", lr.err)
		}
		return fmt.Errorf("reading: %w", lr.err)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		var errno unix.Errno
		if !errors.Is(err, ErrInvalidImage) && !errors.Is(err, ErrTooLarge) && (corrupt(err) || errors.As(err, &errno) && imageErrno(errno)) {
			return invalid("%w", err)
		}
		return err
	}
	if diffID.Algorithm == "sha256" {
		if got := hex.EncodeToString(lr.h.Sum(nil)); got != diffID.Hex {
			return invalid("content is sha256:%s, the config says %s (corrupt image)", got, diffID)
		}
	}
	return nil
}

// imageErrno reports errors that the layer's own content causes: a parent
// that is a file, a dangling or looping symlink on the way, a name too long,
// a hardlink to nothing.
func imageErrno(e unix.Errno) bool {
	switch e {
	case unix.ENOENT, unix.ENOTDIR, unix.ELOOP, unix.ENAMETOOLONG, unix.EINVAL, unix.EXDEV, unix.EISDIR, unix.EMLINK:
		return true
	}
	return false
}

// layerReader reads a layer's uncompressed stream, hashing it, counting it
// against the import's budget, stopping once ctx is done and keeping the
// first read error.
type layerReader struct {
	ctx context.Context
	r   io.Reader
	h   hash.Hash
	b   *budget
	err error
}

func (l *layerReader) Read(p []byte) (int, error) {
	if err := l.ctx.Err(); err != nil {
		return 0, err
	}
	if l.err != nil {
		return 0, l.err
	}
	n, err := l.r.Read(p)
	l.h.Write(p[:n])
	if serr := l.b.read(int64(n)); serr != nil && err == nil {
		err = serr
	}
	if err != nil && err != io.EOF && l.err == nil {
		l.err = err
	}
	return n, err
}

// budget counts what one import reads, writes and keeps in memory.
type budget struct {
	lim    Limits
	charge Charge
	// stream is the uncompressed bytes of layers read, entries their tar
	// entries.
	stream  int64
	entries int
	// paths is the memory the applier's bookkeeping (paths of the layer,
	// directory times) holds, bounded by maxPathBytes.
	paths int64
}

// maxPathBytes bounds the applier's bookkeeping of one import: about what
// 1,000,000 paths of 80 bytes take, far above any real image's.
var maxPathBytes int64 = 128 << 20

// pathCost is what the applier counts for one path it keeps: its bytes
// and the map entry.
func pathCost(p string) int64 { return int64(len(p)) + 48 }

func (b *budget) read(n int64) error {
	b.stream += n
	if b.stream > b.lim.MaxBytes {
		return fmt.Errorf("%w: its layers are over the maximum of %d bytes, uncompressed", ErrTooLarge, b.lim.MaxBytes)
	}
	return nil
}

func (b *budget) entry() error {
	b.entries++
	if b.entries > b.lim.MaxEntries {
		return fmt.Errorf("%w: its layers hold over the maximum of %d entries", ErrTooLarge, b.lim.MaxEntries)
	}
	return nil
}

// file is called before a regular file of n bytes is written. (Its bytes
// come from the stream, which read counts: this check only refuses at once
// a file that could never fit.)
func (b *budget) file(n int64) error {
	if n > b.lim.MaxBytes {
		return fmt.Errorf("%w: its layers are over the maximum of %d bytes, uncompressed", ErrTooLarge, b.lim.MaxBytes)
	}
	if b.charge != nil {
		if err := b.charge(n); err != nil {
			return &chargeError{err}
		}
	}
	return nil
}

// chargeError is a Charge's error, passed on as it is.
type chargeError struct{ err error }

func (e *chargeError) Error() string { return e.err.Error() }
func (e *chargeError) Unwrap() error { return e.err }

func (b *budget) keep(p string) error {
	b.paths += pathCost(p)
	if b.paths > maxPathBytes {
		return fmt.Errorf("%w: it has too many paths, or too deep ones, to track (over %d bytes of them)", ErrTooLarge, maxPathBytes)
	}
	return nil
}
