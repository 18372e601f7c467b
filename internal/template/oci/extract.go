package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Whiteout names (OCI image spec, "Representing Changes").
const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
	paxXattr       = "SCHILY.xattr."
)

// applier writes image layers into a directory one after another, the way an
// overlay filesystem stacks them.
//
// Every path is resolved with openat2(RESOLVE_IN_ROOT) against the directory,
// so symlinks met on the way (including absolute ones and "..") stay inside
// it, as they would for a process chrooted there. The last component of a
// path is never followed: whatever is in the way is removed first and the new
// entry is created with *at calls relative to its parent.
type applier struct {
	root int    // O_PATH descriptor of the directory being filled
	buf  []byte // copy and getdents buffer

	// layer holds the paths the current layer wrote, with their parents:
	// an opaque whiteout hides everything else below its directory.
	layer map[string]struct{}
	// dirTimes are directory times, set last: creating entries changes them.
	dirTimes map[string][2]unix.Timespec
	// droppedDevices counts the character and block devices of the image,
	// which are never created.
	droppedDevices int
	budget         *budget
}

func newApplier(dir string, b *budget) (*applier, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &applier{
		budget:   b,
		root:     fd,
		buf:      make([]byte, 256<<10),
		layer:    map[string]struct{}{},
		dirTimes: map[string][2]unix.Timespec{},
	}, nil
}

func (a *applier) close() error { return unix.Close(a.root) }

// apply writes one uncompressed layer read from r.
func (a *applier) apply(ctx context.Context, r io.Reader) error {
	clear(a.layer)
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, tar.ErrInsecurePath) {
			err = nil // GODEBUG=tarinsecurepath=0; cleanName decides
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w", err)
		}
		if err := a.budget.entry(); err != nil {
			return err
		}
		if err := a.entry(hdr, tr); err != nil {
			if errors.Is(err, ErrTooLarge) {
				return err
			}
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
}

// finish sets the directory times recorded by apply.
func (a *applier) finish() error {
	for name, ts := range a.dirTimes {
		pfd, err := a.resolve(path.Dir(name), unix.O_PATH)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return err
		}
		err = unix.UtimesNanoAt(pfd, path.Base(name), ts[:], unix.AT_SYMLINK_NOFOLLOW)
		unix.Close(pfd)
		if err != nil && err != unix.ENOENT {
			return &fs.PathError{Op: "utimensat", Path: name, Err: err}
		}
	}
	return nil
}

// errUnsafe marks entries refused because they would escape the directory.
var errUnsafe = fmt.Errorf("%w: unsafe path", ErrInvalidImage)

// cleanName turns a tar entry name into a clean path relative to the root
// ("." for the root itself), refusing absolute paths and any ".." component.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty name", errUnsafe)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute path %q", errUnsafe, name)
	}
	if name == ".." || strings.HasPrefix(name, "../") || strings.HasSuffix(name, "/..") || strings.Contains(name, "/../") {
		return "", fmt.Errorf("%w: %q has a \"..\" component", errUnsafe, name)
	}
	return path.Clean(name), nil
}

func (a *applier) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := path.Dir(name), path.Base(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		if base == opaqueWhiteout {
			return a.opaque(dir)
		}
		return a.whiteout(dir, strings.TrimPrefix(base, whiteoutPrefix))
	}
	if isSparse(hdr) {
		// Its holes would be written out as zeros: a few bytes of layer
		// could fill the disk.
		return invalid("a sparse file (not supported)")
	}
	if err := a.mark(name); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeDir {
		if name == "." {
			return invalid("the root must be a directory")
		}
		delete(a.dirTimes, name)
	}

	pfd, err := a.openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeCont:
		if err := a.budget.file(hdr.Size); err != nil {
			return err
		}
		return a.file(pfd, base, hdr, r)
	case tar.TypeDir:
		return a.dir(pfd, name, base, hdr)
	case tar.TypeSymlink:
		if err := replace(pfd, base, func() error { return unix.Symlinkat(hdr.Linkname, pfd, base) }); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		return a.meta(pfd, base, hdr)
	case tar.TypeLink:
		return a.link(pfd, name, base, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock:
		// A device node of the image would be a host device in the
		// template's directory and in every sandbox: dropped (whiteouts of
		// OCI layers are .wh. files, not devices).
		a.droppedDevices++
		return nil
	case tar.TypeFifo:
		return a.fifo(pfd, base, hdr)
	default:
		return invalid("unsupported tar entry type %q", hdr.Typeflag)
	}
}

// mark records that the current layer wrote name (and so its parents).
func (a *applier) mark(name string) error {
	for name != "." {
		if _, ok := a.layer[name]; ok {
			return nil
		}
		if err := a.budget.keep(name); err != nil {
			return err
		}
		a.layer[name] = struct{}{}
		name = path.Dir(name)
	}
	return nil
}

// replace runs mk and, if the name is taken, removes what is there (a whole
// tree for a directory) and runs mk again.
func replace(pfd int, base string, mk func() error) error {
	err := mk()
	if err == unix.EEXIST {
		if err := removeAll(pfd, base); err != nil {
			return err
		}
		err = mk()
	}
	return err
}

func (a *applier) file(pfd int, base string, hdr *tar.Header, r io.Reader) error {
	var fd int
	err := replace(pfd, base, func() (err error) {
		fd, err = unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		return err
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	_, err = io.CopyBuffer(fdWriter(fd), onlyReader{r}, a.buf)
	if err == nil {
		err = unix.Fchown(fd, hdr.Uid, hdr.Gid)
	}
	if err == nil {
		// After chown, which clears set-id bits.
		err = unix.Fchmod(fd, mode(hdr))
	}
	if err == nil {
		err = setXattrs(hdr, func(k string, v []byte) error { return unix.Fsetxattr(fd, k, v, 0) })
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return setTimes(pfd, base, hdr)
}

func (a *applier) dir(pfd int, name, base string, hdr *tar.Header) error {
	err := unix.Mkdirat(pfd, base, 0o700)
	if err == unix.EEXIST {
		var st unix.Stat_t
		if err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err = replace(pfd, base, func() error { return unix.Mkdirat(pfd, base, 0o700) })
		}
	}
	if err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	if err := a.meta(pfd, base, hdr); err != nil {
		return err
	}
	if _, ok := a.dirTimes[name]; !ok {
		if err := a.budget.keep(name); err != nil {
			return err
		}
	}
	a.dirTimes[name] = times(hdr)
	return nil
}

func (a *applier) link(pfd int, name, base, linkname string) error {
	target, err := cleanName(linkname)
	if err != nil {
		return fmt.Errorf("hardlink target: %w", err)
	}
	if target == "." || target == name {
		return invalid("hardlink to %q: not a file of its own", linkname)
	}
	tfd, err := a.resolve(path.Dir(target), unix.O_PATH)
	if err != nil {
		return fmt.Errorf("hardlink target %q: %w", linkname, err)
	}
	defer unix.Close(tfd)
	tbase := path.Base(target)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hardlink target %q: %w", linkname, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return invalid("hardlink target %q is a directory", linkname)
	}
	if err := replace(pfd, base, func() error { return unix.Linkat(tfd, tbase, pfd, base, 0) }); err != nil {
		return fmt.Errorf("hardlink to %q: %w", linkname, err)
	}
	return nil
}

func (a *applier) fifo(pfd int, base string, hdr *tar.Header) error {
	err := replace(pfd, base, func() error { return unix.Mknodat(pfd, base, unix.S_IFIFO|mode(hdr), 0) })
	if err != nil {
		return fmt.Errorf("mkfifo: %w", err)
	}
	return a.meta(pfd, base, hdr)
}

// meta sets owner, mode, xattrs and times of an entry just created under
// pfd (for a symlink: owner and times). Directory times are set by finish.
func (a *applier) meta(pfd int, base string, hdr *tar.Header) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// A directory, device or fifo just made here: fchmodat follows no
		// symlink.
		if err := unix.Fchmodat(pfd, base, mode(hdr), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
		if err := setXattrs(hdr, func(k string, v []byte) error {
			// Through the parent's descriptor: lsetxattr does not follow base.
			return unix.Lsetxattr(fmt.Sprintf("/proc/self/fd/%d/%s", pfd, base), k, v, 0)
		}); err != nil {
			return err
		}
	}
	if hdr.Typeflag == tar.TypeDir {
		return nil
	}
	return setTimes(pfd, base, hdr)
}

// whiteout removes dir/name, which a lower layer made.
func (a *applier) whiteout(dir, name string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return fmt.Errorf("%w: whiteout of %q", errUnsafe, name)
	}
	pfd, err := a.resolve(dir, unix.O_PATH)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	delete(a.dirTimes, path.Join(dir, name))
	return removeAll(pfd, name)
}

// opaque empties dir of everything lower layers put there.
func (a *applier) opaque(dir string) error {
	fd, err := a.resolve(dir, unix.O_RDONLY)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return a.clearLower(fd, dir)
}

func (a *applier) clearLower(fd int, dir string) error {
	names, err := readDirNames(fd, a.buf)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if _, ok := a.layer[p]; !ok {
			delete(a.dirTimes, p)
			if err := removeAll(fd, n); err != nil {
				return err
			}
			continue
		}
		cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOTDIR || err == unix.ELOOP {
			continue // written by this layer and not a directory
		}
		if err != nil {
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		err = a.clearLower(cfd, p)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// readDirNames lists a directory, using buf for getdents.
func readDirNames(fd int, buf []byte) ([]string, error) {
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("getdents: %w", err)
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// removeAll removes name under dirfd, a whole tree if it is a directory,
// never following symlinks.
func removeAll(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return &fs.PathError{Op: "unlink", Path: name, Err: err}
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: name, Err: err}
	}
	names, err := readDirNames(fd, make([]byte, 8<<10))
	for _, n := range names {
		if err != nil {
			break
		}
		err = removeAll(fd, n)
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil {
		return &fs.PathError{Op: "rmdir", Path: name, Err: err}
	}
	return nil
}

// resolve opens the directory name inside the root, following symlinks as if
// the root were "/".
func (a *applier) resolve(name string, flags uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for {
		fd, err := unix.Openat2(a.root, name, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return -1, &fs.PathError{Op: "openat2", Path: name, Err: err}
		}
		return fd, nil
	}
}

// openDir is resolve(name, O_PATH), creating missing directories (0755,
// owned by the caller) as tar extraction does.
func (a *applier) openDir(name string) (int, error) {
	fd, err := a.resolve(name, unix.O_PATH)
	if err == nil || name == "." || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	pfd, err := a.openDir(path.Dir(name))
	if err != nil {
		return -1, err
	}
	base := path.Base(name)
	err = unix.Mkdirat(pfd, base, 0o755)
	if err == nil {
		err = unix.Fchmodat(pfd, base, 0o755, 0) // whatever the umask
	}
	unix.Close(pfd)
	if err != nil && err != unix.EEXIST {
		return -1, &fs.PathError{Op: "mkdir", Path: name, Err: err}
	}
	// EEXIST: a dangling symlink is in the way; resolve says so.
	return a.resolve(name, unix.O_PATH)
}

// mode is an entry's permission bits, without the set-user-ID and
// set-group-ID bits of anything but a directory: an image cannot plant a
// set-id program (a directory's set-group-ID only passes its group on).
func mode(hdr *tar.Header) uint32 {
	m := uint32(hdr.Mode) & 0o7777
	if hdr.Typeflag != tar.TypeDir {
		m &^= unix.S_ISUID | unix.S_ISGID
	}
	return m
}

func times(hdr *tar.Header) [2]unix.Timespec {
	m := unix.Timespec{Sec: hdr.ModTime.Unix(), Nsec: int64(hdr.ModTime.Nanosecond())}
	at := m
	if !hdr.AccessTime.IsZero() {
		at = unix.Timespec{Sec: hdr.AccessTime.Unix(), Nsec: int64(hdr.AccessTime.Nanosecond())}
	}
	return [2]unix.Timespec{at, m}
}

func setTimes(pfd int, base string, hdr *tar.Header) error {
	ts := times(hdr)
	if err := unix.UtimesNanoAt(pfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimensat: %w", err)
	}
	return nil
}

// setXattrs applies the entry's user.* extended attributes. The others are
// dropped: security.* (file capabilities, SELinux labels), trusted.* and
// user.overlay.* (overlayfs' own, which would change how the root
// filesystem reads as an overlay's lower directory) and system.* (ACLs).
// Attributes the filesystem does not support are skipped.
func setXattrs(hdr *tar.Header, set func(string, []byte) error) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok || !keptXattr(name) {
			continue
		}
		err := set(name, []byte(v))
		if err == unix.ENOTSUP {
			continue
		}
		if err != nil {
			return fmt.Errorf("setxattr %s: %w", name, err)
		}
	}
	return nil
}

// keptXattr reports whether an image's extended attribute is restored.
func keptXattr(name string) bool {
	return strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, "user.overlay.")
}

// fdWriter writes to a file descriptor.
type fdWriter int

func (w fdWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Write(int(w), p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

// onlyReader hides any WriterTo so io.CopyBuffer uses the given buffer.
type onlyReader struct{ io.Reader }

// readAhead reads r in its own goroutine, up to a few chunks ahead of its
// reader, so that decompressing and hashing a layer overlap with writing its
// files.
type readAhead struct {
	full chan []byte // filled chunks; closed after the last, with err set
	free chan []byte // chunks to fill
	done chan struct{}
	err  error  // r's error (io.EOF at the end); read once full is closed
	cur  []byte // what is left of the chunk being read
	last []byte // that chunk, to give back
}

func newReadAhead(r io.Reader, chunk, n int) *readAhead {
	ra := &readAhead{full: make(chan []byte, n), free: make(chan []byte, n), done: make(chan struct{})}
	for range n {
		ra.free <- make([]byte, chunk)
	}
	go ra.fill(r)
	return ra
}

func (ra *readAhead) fill(r io.Reader) {
	defer close(ra.full)
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			return
		}
		n, err := 0, error(nil)
		for n < len(buf) && err == nil {
			var m int
			m, err = r.Read(buf[n:])
			n += m
		}
		if n > 0 {
			ra.full <- buf[:n] // never blocks: full holds every chunk
		}
		if err != nil {
			ra.err = err
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.last != nil {
			ra.free <- ra.last[:cap(ra.last)]
			ra.last = nil
		}
		buf, ok := <-ra.full
		if !ok {
			return 0, ra.err
		}
		ra.cur, ra.last = buf, buf
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// close stops the goroutine and waits for it to end.
func (ra *readAhead) close() {
	close(ra.done)
	for range ra.full {
	}
}
