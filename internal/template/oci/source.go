package oci

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// A source is where the files of an uploaded image are read from: an OCI
// layout directory, or a tar archive (an OCI layout or a docker-archive).
// Whatever a user put in it, a read resolves inside it, opens a regular
// file only (never a symlink, device or FIFO, so it never blocks) and
// reads at most what its caller bounds.
type source interface {
	// open opens the regular file name (slash-separated, relative) and
	// returns its size.
	open(name string) (io.ReadCloser, int64, error)
	// has reports whether name is present, whatever its type.
	has(name string) bool
}

// maxMetadataBytes bounds the files of an image that are read whole into
// memory: index.json, manifest.json, manifests, indexes and configs.
const maxMetadataBytes = 4 << 20

// readAll reads the whole of name from src, refusing one over max bytes
// without reading it.
func readAll(src source, name string, max int64) ([]byte, error) {
	rc, size, err := src.open(name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if size > max {
		return nil, invalid("%s is %d bytes, over the maximum of %d for image metadata", name, size, max)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(rc, b); err != nil {
		return nil, invalid("reading %s: %w", name, err)
	}
	return b, nil
}

// dirSource reads an image laid out in a directory.
type dirSource struct {
	root int // O_PATH descriptor of the directory
	dir  string
}

func openDirSource(dir string) (*dirSource, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &dirSource{root: fd, dir: dir}, nil
}

func (d *dirSource) close() error { return unix.Close(d.root) }

// openat opens name beneath the root without following any symlink (nor
// the kernel's magic links), non-blocking, and checks that it is a regular
// file before anything is read from it.
func (d *dirSource) openat(name string) (*os.File, int64, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	var fd int
	var err error
	for {
		fd, err = unix.Openat2(d.root, name, &how)
		if err != unix.EINTR && err != unix.EAGAIN {
			break
		}
	}
	switch {
	case err == unix.ELOOP:
		return nil, 0, invalid("%s is a symbolic link (links are not followed in an uploaded image)", name)
	case err == unix.EXDEV:
		return nil, 0, invalid("%s leaves the image's directory", name)
	case err != nil:
		return nil, 0, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, 0, &fs.PathError{Op: "fstat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, 0, invalid("%s is not a regular file", name)
	}
	return os.NewFile(uintptr(fd), path.Join(d.dir, name)), st.Size, nil
}

func (d *dirSource) open(name string) (io.ReadCloser, int64, error) {
	f, size, err := d.openat(name)
	if err != nil {
		return nil, 0, err
	}
	return f, size, nil
}

func (d *dirSource) has(name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(d.root, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// member is a member of a tar archive.
type member struct {
	typ    byte
	offset int64 // of the data
	size   int64
	link   string
}

// maxArchiveMembers bounds the members of an uploaded image archive: an
// OCI layout holds a few files per layer, a docker-archive a few more.
const maxArchiveMembers = 100_000

// tarSource reads an image from a tar archive: the members are found by a
// scan of the headers (scanArchive) and read in place, as sections of the
// file, never extracted.
type tarSource struct {
	f       *os.File
	members map[string]member // by clean name
	names   []string          // in archive order
}

// scanArchive reads the headers of the archive f and checks that it is
// whole: a truncated archive is refused before anything else is read.
func scanArchive(f *os.File) (*tarSource, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	ts := &tarSource{f: f, members: map[string]member{}}
	// The reader skips entry data by seeking, checking it is there. It takes
	// a file cut at an entry boundary for a whole archive: the end-of-archive
	// marker (two zero blocks) after the last entry tells them apart.
	tr := tar.NewReader(f)
	var end int64 // where the last entry's data ends
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return nil, invalid("truncated or corrupt tarball: %w", err)
		}
		if len(ts.names) >= maxArchiveMembers {
			return nil, fmt.Errorf("%w: the archive has more than %d members", ErrTooLarge, maxArchiveMembers)
		}
		pos, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		name := path.Clean(hdr.Name)
		if isSparse(hdr) {
			// Neither format has any; its size is not what it takes in the
			// archive, and a few bytes may stand for terabytes of zeros.
			return nil, invalid("%s is a sparse file (not supported in an image archive)", name)
		}
		m := member{typ: hdr.Typeflag, offset: pos, size: hdr.Size, link: hdr.Linkname}
		end = pos + (hdr.Size+511)&^511
		if _, dup := ts.members[name]; !dup {
			// As go-containerregistry's tarball reader: the first one counts.
			ts.members[name] = m
			ts.names = append(ts.names, name)
		}
	}
	var marker [1024]byte
	if n, _ := f.ReadAt(marker[:], end); n < len(marker) || marker != [1024]byte{} {
		return nil, invalid("truncated or corrupt tarball: no end-of-archive marker after the last entry")
	}
	return ts, nil
}

func (ts *tarSource) has(name string) bool {
	_, ok := ts.members[path.Clean(name)]
	return ok
}

// open opens a regular member. Links are not followed.
func (ts *tarSource) open(name string) (io.ReadCloser, int64, error) {
	m, ok := ts.members[path.Clean(name)]
	if !ok {
		return nil, 0, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	if err := m.regular(name); err != nil {
		return nil, 0, err
	}
	return io.NopCloser(io.NewSectionReader(ts.f, m.offset, m.size)), m.size, nil
}

func (m member) regular(name string) error {
	switch {
	case m.typ == tar.TypeSymlink || m.typ == tar.TypeLink:
		return invalid("%s is a link in the archive (links are not followed in an uploaded OCI layout)", name)
	case m.typ != tar.TypeReg:
		return invalid("%s is not a regular file", name)
	}
	return nil
}

// resolve finds name the way go-containerregistry's docker-archive reader
// does (the first member of that name, following links by name inside the
// archive) and returns that member: the docker-archive path checks with it
// what that reader will read whole.
func (ts *tarSource) resolve(name string) (member, error) {
	seen := map[string]bool{}
	for {
		name = path.Clean(name)
		if seen[name] {
			return member{}, invalid("%s: a cycle of links", name)
		}
		seen[name] = true
		m, ok := ts.members[name]
		if !ok {
			return member{}, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		if m.typ != tar.TypeSymlink && m.typ != tar.TypeLink {
			return m, m.regular(name)
		}
		name = path.Join(path.Dir(name), path.Clean(m.link))
	}
}

// isSparse reports whether a tar entry is a sparse file, in the old GNU
// format or GNU's PAX formats: its data is a fraction of its size, so a
// few bytes of archive may stand for terabytes of zeros.
func isSparse(hdr *tar.Header) bool {
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
