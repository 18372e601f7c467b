package template

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// extractOptions say how much of a tar archive's metadata is kept.
type extractOptions struct {
	// layer: the archive is a copy-on-write layer in overlayfs format
	// (runsc tar rootfs-upper): ownership, modes, the xattrs of allowedXattr
	// and whiteouts (0/0 character devices) are kept; other devices are
	// dropped. Otherwise (a build context, from a user) everything is owned
	// by root, devices are refused and xattrs dropped. Either way files
	// lose their set-user-ID and set-group-ID bits (entryMode).
	layer bool
	// maxBytes bounds the total size of the regular files (0 =
	// defaultMaxBytes); maxEntries the members (0 = defaultMaxEntries).
	maxBytes   int64
	maxEntries int
	// charge, if set, is told the size of each regular file before it is
	// written; its error stops the extraction (a storage quota).
	charge func(n int64) error
}

// Defaults of extractOptions, and the bound of the metadata an extraction
// keeps in memory (directories made and their metadata, applied last):
// about what 1,000,000 directories take, far above any real tree's.
const (
	defaultMaxBytes   = 64 << 30
	defaultMaxEntries = 1_000_000
)

var maxMetaBytes int64 = 128 << 20

func (o extractOptions) withDefaults() extractOptions {
	if o.maxBytes <= 0 {
		o.maxBytes = defaultMaxBytes
	}
	if o.maxEntries <= 0 {
		o.maxEntries = defaultMaxEntries
	}
	return o
}

// errTooLarge is returned when an archive passes maxBytes or maxEntries,
// or keeps too much metadata in memory.
var errTooLarge = errors.New("archive is larger than the maximum")

// paxXattr is the prefix of PAX records that carry extended attributes.
const paxXattr = "SCHILY.xattr."

// opaqueXattr marks an overlayfs directory that hides the lower layers'.
const opaqueXattr = "trusted.overlay.opaque"

// allowedXattr reports whether a layer may carry the xattr k (with value
// v): the opaque marker of a directory, and user.* attributes. The other
// trusted.overlay.* attributes (redirects, metacopy) and user.overlay.*
// would let a build step steer the host's overlayfs; security.capability
// would give a program file capabilities, and system.* (ACLs) grant access
// the modes do not show: all dropped.
func allowedXattr(k, v string, dir bool) bool {
	switch {
	case k == opaqueXattr:
		return dir && v == "y"
	case strings.HasPrefix(k, "user.overlay."):
		return false
	case strings.HasPrefix(k, "user."):
		return true
	}
	return false
}

// entryMode is the permission bits kept of a member: set-user-ID and
// set-group-ID are cleared on anything but a directory (whose set-group-ID
// only passes its group on to new files), so that neither a build step nor
// a build context can plant a set-id program in a template.
func entryMode(hdr *tar.Header) uint32 {
	m := uint32(hdr.Mode) & 0o7777
	if hdr.Typeflag != tar.TypeDir {
		m &^= unix.S_ISUID | unix.S_ISGID
	}
	return m
}

// cleanName turns an archive member name into a clean relative path ("."
// for the root). Absolute names, ".." components and NUL bytes are errors.
func cleanName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("name %q has a NUL byte", name)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%q is an absolute path", name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("%q leaves the archive's root (..)", name)
		}
	}
	return path.Clean(name), nil
}

// dirMeta is metadata applied to a directory once its content is in place
// (creating children changes a directory's mtime).
type dirMeta struct {
	rel    string
	hdr    *tar.Header
	xattrs map[string]string
}

// extractTar unpacks a tar stream into dir, which must exist. It never
// follows a symlink: every parent directory is opened beneath dir with
// symlinks refused (openat2), and entries are created with *at calls, so
// an archive cannot write outside dir whatever its order of members. It
// returns the bytes of regular files written.
func extractTar(r io.Reader, dir string, o extractOptions) (int64, error) {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(root)
	x := &extractor{root: root, dir: dir, o: o.withDefaults(), dirs: map[string]bool{".": true}}
	defer x.closeParents()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return x.total, fmt.Errorf("reading the archive: %w", err)
		}
		if x.entries++; x.entries > x.o.maxEntries {
			return x.total, fmt.Errorf("%w: more than %d members", errTooLarge, x.o.maxEntries)
		}
		if err := x.entry(hdr, tr); err != nil {
			return x.total, err
		}
	}
	// Directory metadata last, deepest first (a parent's mtime changes
	// while its children are made; a read-only parent would refuse them).
	for _, dm := range slices.Backward(x.metas) {
		if err := x.applyDir(dm); err != nil {
			return x.total, err
		}
	}
	return x.total, nil
}

type extractor struct {
	root    int
	dir     string
	o       extractOptions
	total   int64
	entries int
	meta    int64           // bytes of dirs and metas, bounded by maxMetaBytes
	dirs    map[string]bool // directories made (or the root)
	metas   []dirMeta
	// parent caches the last opened parent directory.
	parentRel string
	parentFD  int
}

func (x *extractor) closeParents() {
	if x.parentRel != "" {
		unix.Close(x.parentFD)
		x.parentRel = ""
	}
}

// openParent opens the directory rel (relative to the root) without
// following any symlink.
func (x *extractor) openParent(rel string) (int, error) {
	if rel == "." {
		return x.root, nil
	}
	if x.parentRel == rel {
		return x.parentFD, nil
	}
	x.closeParents()
	fd, err := unix.Openat2(x.root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("%s: parent directory: %w", rel, err)
	}
	x.parentRel, x.parentFD = rel, fd
	return fd, nil
}

// mkdirs makes the missing parent directories of rel (root-owned, 0755),
// as archives may leave them out.
func (x *extractor) mkdirs(rel string) error {
	if x.dirs[rel] {
		return nil
	}
	parent := path.Dir(rel)
	if err := x.mkdirs(parent); err != nil {
		return err
	}
	pfd, err := x.openParent(parent)
	if err != nil {
		return err
	}
	if err := unix.Mkdirat(pfd, path.Base(rel), 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s: mkdir: %w", rel, err)
	}
	return x.addDir(rel)
}

// addDir records the directory rel as made.
func (x *extractor) addDir(rel string) error {
	if !x.dirs[rel] {
		if err := x.keep(int64(len(rel)) + 48); err != nil {
			return err
		}
		x.dirs[rel] = true
	}
	return nil
}

// keep counts n bytes of metadata held until the end.
func (x *extractor) keep(n int64) error {
	if x.meta += n; x.meta > maxMetaBytes {
		return fmt.Errorf("%w: too many directories, or too much of their metadata, to keep (over %d bytes)", errTooLarge, maxMetaBytes)
	}
	return nil
}

// addMeta records a directory's metadata, applied at the end.
func (x *extractor) addMeta(dm dirMeta) error {
	n := int64(len(dm.rel)) + 256
	for k, v := range dm.xattrs {
		n += int64(len(k) + len(v))
	}
	if err := x.keep(n); err != nil {
		return err
	}
	// Only what applyDir uses of the header is kept.
	dm.hdr = &tar.Header{Typeflag: dm.hdr.Typeflag, Mode: dm.hdr.Mode, Uid: dm.hdr.Uid, Gid: dm.hdr.Gid, ModTime: dm.hdr.ModTime}
	x.metas = append(x.metas, dm)
	return nil
}

func (x *extractor) xattrsOf(hdr *tar.Header) map[string]string {
	if !x.o.layer || len(hdr.PAXRecords) == 0 {
		return nil
	}
	var m map[string]string
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok || !allowedXattr(name, v, hdr.Typeflag == tar.TypeDir) {
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[name] = v
	}
	return m
}

func (x *extractor) entry(hdr *tar.Header, body io.Reader) error {
	rel, err := checkMember(hdr, x.o.layer)
	if err != nil {
		return err
	}
	if rel == "." {
		return x.addMeta(dirMeta{rel: ".", hdr: hdr, xattrs: x.xattrsOf(hdr)})
	}
	parent, base := path.Dir(rel), path.Base(rel)
	if err := x.mkdirs(parent); err != nil {
		return err
	}
	pfd, err := x.openParent(parent)
	if err != nil {
		return err
	}
	uid, gid := 0, 0
	if x.o.layer {
		uid, gid = hdr.Uid, hdr.Gid
	}
	mode := entryMode(hdr)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			if !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("%s: mkdir: %w", rel, err)
			}
			var st unix.Stat_t
			if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("%s: exists and is not a directory", rel)
			}
		}
		if err := x.addDir(rel); err != nil {
			return err
		}
		return x.addMeta(dirMeta{rel: rel, hdr: hdr, xattrs: x.xattrsOf(hdr)})
	case tar.TypeReg:
		if x.total+hdr.Size > x.o.maxBytes {
			return errTooLarge
		}
		if x.o.charge != nil {
			if err := x.o.charge(hdr.Size); err != nil {
				return err
			}
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("%s: create: %w", rel, err)
		}
		f := os.NewFile(uintptr(fd), rel)
		n, err := io.Copy(f, body)
		x.total += n
		if err == nil && n != hdr.Size {
			err = io.ErrUnexpectedEOF
		}
		if err == nil {
			err = fileMeta(fd, uid, gid, mode, x.xattrsOf(hdr), hdr.ModTime)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	case tar.TypeLink:
		target, _ := cleanName(hdr.Linkname) // checkMember checked it
		tfd, err := unix.Openat2(x.root, path.Dir(target), &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return fmt.Errorf("%s: hard link target %q: %w", rel, hdr.Linkname, err)
		}
		defer unix.Close(tfd)
		var st unix.Stat_t
		if err := unix.Fstatat(tfd, path.Base(target), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: hard link target %q: %w", rel, hdr.Linkname, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return fmt.Errorf("%s: hard link to a directory", rel)
		}
		if err := unix.Linkat(tfd, path.Base(target), pfd, base, 0); err != nil {
			return fmt.Errorf("%s: link: %w", rel, err)
		}
		return nil
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("%s: symlink: %w", rel, err)
		}
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: chown: %w", rel, err)
		}
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		return nil
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Typeflag != tar.TypeChar || hdr.Devmajor != 0 || hdr.Devminor != 0 {
			// Only whiteouts: a build step must not plant device nodes.
			return nil
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("%s: whiteout: %w", rel, err)
		}
		return nil
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|mode&0o777, 0); err != nil {
			return fmt.Errorf("%s: mkfifo: %w", rel, err)
		}
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: chown: %w", rel, err)
		}
		return nil
	}
	return nil // tar.TypeXGlobalHeader
}

// checkMember checks what can be checked of a member from its header
// alone — what extractTar refuses whatever came before it — and returns
// its clean name: no absolute name, no "..", no NUL, no sparse file, only
// the types extractTar makes (devices only in a layer, where it keeps the
// whiteouts), link targets that are names of the archive.
func checkMember(hdr *tar.Header, layer bool) (string, error) {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return "", err
	}
	if IsSparse(hdr) {
		// Its holes would be written out as zeros: a few bytes of archive
		// could fill the disk.
		return "", fmt.Errorf("%s: a sparse file (not supported)", rel)
	}
	if rel == "." && hdr.Typeflag != tar.TypeDir {
		return "", fmt.Errorf("the archive's root is not a directory")
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeFifo, tar.TypeXGlobalHeader:
	case tar.TypeLink:
		if target, err := cleanName(hdr.Linkname); err != nil || target == "." {
			return "", fmt.Errorf("%s: bad hard link target %q", rel, hdr.Linkname)
		}
	case tar.TypeSymlink:
		if strings.ContainsRune(hdr.Linkname, 0) || hdr.Linkname == "" {
			return "", fmt.Errorf("%s: bad symlink target", rel)
		}
	case tar.TypeChar, tar.TypeBlock:
		if !layer {
			return "", fmt.Errorf("%s: device files are not allowed", rel)
		}
	default:
		return "", fmt.Errorf("%s: unsupported archive member type %q", rel, string(hdr.Typeflag))
	}
	return rel, nil
}

// applyDir sets a directory's ownership, mode, xattrs and mtime.
func (x *extractor) applyDir(dm dirMeta) error {
	x.closeParents()
	var fd int
	var err error
	if dm.rel == "." {
		fd, err = unix.Open(x.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	} else {
		fd, err = unix.Openat2(x.root, dm.rel, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
	}
	if err != nil {
		return fmt.Errorf("%s: %w", dm.rel, err)
	}
	defer unix.Close(fd)
	uid, gid := 0, 0
	mode := entryMode(dm.hdr)
	if x.o.layer {
		uid, gid = dm.hdr.Uid, dm.hdr.Gid
	} else if mode&0o700 != 0o700 {
		// A context directory the server cannot walk is no use.
		mode |= 0o700
	}
	if err := fileMeta(fd, uid, gid, mode, dm.xattrs, dm.hdr.ModTime); err != nil {
		return fmt.Errorf("%s: %w", dm.rel, err)
	}
	return nil
}

// fileMeta sets ownership, then mode (chown clears set-id bits), xattrs
// and mtime on an open file or directory.
func fileMeta(fd, uid, gid int, mode uint32, xattrs map[string]string, mtime time.Time) error {
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	for k, v := range xattrs {
		if err := unix.Fsetxattr(fd, k, []byte(v), 0); err != nil {
			return fmt.Errorf("setxattr %s: %w", k, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

// describeTarError makes an archive read error readable for users.
func describeTarError(err error) string {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "not a valid tar archive (" + err.Error() + ")"
	}
	return err.Error()
}

// octal formats a mode for messages.
func octal(m uint32) string { return "0" + strconv.FormatUint(uint64(m), 8) }

// IsSparse reports whether a tar entry is a sparse file, in the old GNU
// format or GNU's PAX formats: its data is a fraction of its size, so a
// few bytes of archive may stand for terabytes of zeros.
func IsSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}
