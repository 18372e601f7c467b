package namespaces

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/runtime"
)

// A sandbox's copy-on-write layer is the upper directory of its overlay,
// on its disk (a tmpfs in its own mount namespace). The init stage sends
// the host a descriptor of that directory (the only way to it: no path of
// the host leads there), and the host reads it to export the layer as a
// tar archive in overlayfs format (runtime.UpperExporter): a deleted file
// is a 0/0 character device, a directory that replaced a template one
// carries trusted.overlay.opaque=y in a PAX record. The init stage of a
// sandbox started from such an archive writes it into the empty upper
// directory before it mounts the overlay (runtime.UpperImporter).
//
// The overlay is mounted with userxattr: in a user namespace it cannot
// set trusted.* attributes, so without it removing a template directory
// fails with EIO; with it the opaque marker is user.overlay.opaque.
//
// Both directions treat the tree as hostile: the sandbox wrote it. Every
// open is relative to a directory descriptor and refuses symlinks, magic
// links and other mounts (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS…),
// so neither the host (export) nor the init stage (import, before the
// pivot) can be led outside the layer.

const (
	// opaqueUserXattr is the overlay's opaque marker in the upper
	// directory (mounted with userxattr).
	opaqueUserXattr = "user.overlay.opaque"
	// opaquePAX is the marker in the archive, as runtime.UpperExporter
	// writes it.
	opaquePAX = "SCHILY.xattr.trusted.overlay.opaque"
	// tarBlock is the size of a tar header block.
	tarBlock = 512
	// maxUpperDepth bounds how deep a layer's directories may nest.
	maxUpperDepth = 256
	// overflowID is the owner of a file whose host owner is outside the
	// sandbox's id block (none should be).
	overflowID = 65534
)

// beneath opens name (one component or a relative path) under dirfd
// without following any symlink or leaving the file system.
func beneath(dirfd int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// upperExport writes an upper directory as an archive.
type upperExport struct {
	ctx context.Context
	tw  *tar.Writer
	// base is the host id of the sandbox's id 0: owners are written as
	// the sandbox sees them.
	base uint32
	// left is how many bytes of file content may still be written.
	left int64
}

// exportUpper writes the layer upper (a directory descriptor) to w as a
// tar archive in overlayfs format, with owners as the sandbox sees them
// (base is the host id of its id 0), and at most limit bytes of file
// content and headers (runtime.ErrUpperTooLarge). Hard links become copies; sockets are left
// out, as is the agent's mount point (/.evalbox).
func exportUpper(ctx context.Context, upper int, base uint32, limit int64, w io.Writer) error {
	x := &upperExport{ctx: ctx, tw: tar.NewWriter(w), base: base, left: limit}
	// The layer's top is the sandbox's /: its owner and mode (a build
	// from the archive gives them to its root, as runsc's archive does).
	var st unix.Stat_t
	if err := unix.Fstat(upper, &st); err != nil {
		return fmt.Errorf("stat /: %w", err)
	}
	if err := x.tw.WriteHeader(x.header(&st, "./", tar.TypeDir)); err != nil {
		return err
	}
	if err := x.dir(upper, "", 0); err != nil {
		return err
	}
	return x.tw.Close()
}

func (x *upperExport) id(host uint32) int {
	if host < x.base || host-x.base >= idBlockSize {
		return overflowID
	}
	return int(host - x.base)
}

func (x *upperExport) header(st *unix.Stat_t, name string, typ byte) *tar.Header {
	return &tar.Header{Typeflag: typ, Name: name, Mode: int64(st.Mode & 0o7777),
		Uid: x.id(st.Uid), Gid: x.id(st.Gid), ModTime: time.Unix(st.Mtim.Unix()).UTC(), Format: tar.FormatPAX}
}

// dir writes the entries of the directory fd, whose path in the layer is
// rel ("" for the top, else ending in /).
func (x *upperExport) dir(fd int, rel string, depth int) error {
	if depth > maxUpperDepth {
		return fmt.Errorf("%s: directories nest deeper than %d", rel, maxUpperDepth)
	}
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read %s: %w", cmpRel(rel), err)
	}
	for _, name := range names {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		if rel == "" && name == ".evalbox" {
			continue
		}
		if err := x.entry(fd, rel, name, depth); err != nil {
			return err
		}
	}
	return nil
}

func cmpRel(rel string) string {
	if rel == "" {
		return "/"
	}
	return "/" + rel
}

// readNames lists the directory fd, sorted (an archive of the same tree is
// the same archive).
func readNames(fd int) ([]string, error) {
	dup, err := beneath(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "upper-dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	slices.Sort(names)
	return names, err
}

func (x *upperExport) entry(dirfd int, rel, name string, depth int) error {
	p := rel + name
	// Every member costs a block of headers at least: an archive of a
	// million empty files is large too.
	if x.left -= tarBlock; x.left < 0 {
		return fmt.Errorf("/%s: %w", p, runtime.ErrUpperTooLarge)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone since the listing
		}
		return fmt.Errorf("stat /%s: %w", p, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := beneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("open /%s: %w", p, err)
		}
		defer unix.Close(fd)
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("stat /%s: %w", p, err)
		}
		hdr := x.header(&st, p+"/", tar.TypeDir)
		buf := make([]byte, 4)
		if n, err := unix.Fgetxattr(fd, opaqueUserXattr, buf); err == nil && n == 1 && buf[0] == 'y' {
			hdr.PAXRecords = map[string]string{opaquePAX: "y"}
		}
		if err := x.tw.WriteHeader(hdr); err != nil {
			return err
		}
		return x.dir(fd, p+"/", depth+1)
	case unix.S_IFREG:
		fd, err := beneath(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK)
		if err != nil {
			return fmt.Errorf("open /%s: %w", p, err)
		}
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("stat /%s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("/%s changed while it was read", p)
		}
		if st.Size > x.left {
			return fmt.Errorf("/%s: %w", p, runtime.ErrUpperTooLarge)
		}
		x.left -= st.Size
		hdr := x.header(&st, p, tar.TypeReg)
		hdr.Size = st.Size
		if err := x.tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.CopyN(x.tw, f, st.Size); err != nil {
			return fmt.Errorf("read /%s: %w", p, err)
		}
		return nil
	case unix.S_IFLNK:
		target, err := readlinkat(dirfd, name)
		if err != nil {
			return fmt.Errorf("readlink /%s: %w", p, err)
		}
		hdr := x.header(&st, p, tar.TypeSymlink)
		hdr.Linkname = target
		return x.tw.WriteHeader(hdr)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return nil // a device node cannot be made in a sandbox; not a whiteout
		}
		return x.tw.WriteHeader(x.header(&st, p, tar.TypeChar))
	case unix.S_IFIFO:
		return x.tw.WriteHeader(x.header(&st, p, tar.TypeFifo))
	}
	return nil // sockets, block devices
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// importUpper writes the archive r (exportUpper's) into the empty layer
// directory upper. It runs in the init stage, as root of the sandbox's
// user namespace: the owners are the sandbox's ids. A member that is not
// what exportUpper writes (an absolute or .. name, a missing parent, a
// type it does not write) fails it.
func importUpper(upper int, r io.Reader) error {
	tr := tar.NewReader(r)
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("the snapshot's files: %w", err)
		}
		name, err := memberName(hdr.Name)
		if err != nil {
			return err
		}
		if err := importEntry(upper, name, hdr, tr); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return fmt.Errorf("the snapshot's files do not fit the sandbox's disk: %w", err)
			}
			return fmt.Errorf("the snapshot's /%s: %w", name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{name, hdr.ModTime})
		}
	}
	// A directory's time, once its entries are written.
	for _, d := range slices.Backward(dirs) {
		fd, err := beneath(upper, d.name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("the snapshot's /%s: %w", d.name, err)
		}
		ts := unix.NsecToTimespec(d.t.UnixNano())
		err = unix.UtimesNanoAt(fd, "", []unix.Timespec{ts, ts}, unix.AT_EMPTY_PATH)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("the snapshot's /%s: %w", d.name, err)
		}
	}
	return nil
}

// memberName checks an archive member's name: relative, clean, no "..".
func memberName(n string) (string, error) {
	clean := strings.TrimSuffix(n, "/")
	if clean == "" || path.IsAbs(clean) || path.Clean(clean) != clean || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("the snapshot's files: bad member name %q", n)
	}
	return clean, nil
}

func importEntry(upper int, name string, hdr *tar.Header, body io.Reader) error {
	parent := "."
	base := name
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		parent, base = name[:i], name[i+1:]
	}
	pfd, err := beneath(upper, parent, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	mode := uint32(hdr.Mode & 0o7777)
	if name == "." {
		// The sandbox's /: the layer itself, there already.
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("the top of the archive is not a directory")
		}
		fd, err := beneath(upper, ".", unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return ownAndMode(fd, hdr, mode)
	}
	ts := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	times := []unix.Timespec{ts, ts}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return err
		}
		fd, err := beneath(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if hdr.PAXRecords[opaquePAX] == "y" {
			if err := unix.Fsetxattr(fd, opaqueUserXattr, []byte("y"), 0); err != nil {
				return err
			}
		}
		return ownAndMode(fd, hdr, mode)
	case tar.TypeReg:
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		if _, err := io.Copy(f, body); err != nil {
			return err
		}
		if err := ownAndMode(fd, hdr, mode); err != nil {
			return err
		}
		return unix.UtimesNanoAt(fd, "", times, unix.AT_EMPTY_PATH)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.UtimesNanoAt(pfd, base, times, unix.AT_SYMLINK_NOFOLLOW)
	case tar.TypeChar, tar.TypeFifo:
		if hdr.Typeflag == tar.TypeChar && (hdr.Devmajor != 0 || hdr.Devminor != 0) {
			return errors.New("a device node (only whiteouts are kept)")
		}
		typ := uint32(unix.S_IFCHR)
		if hdr.Typeflag == tar.TypeFifo {
			typ = unix.S_IFIFO
		}
		if err := unix.Mknodat(pfd, base, typ|mode, 0); err != nil {
			return err
		}
		return unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
	}
	return fmt.Errorf("a member of type %q", hdr.Typeflag)
}

// ownAndMode sets a file's owner, then its mode (a chown clears set-id
// bits).
func ownAndMode(fd int, hdr *tar.Header, mode uint32) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	return unix.Fchmod(fd, mode)
}
