package agent

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/yamux"

	"github.com/evalbox/evalbox/internal/agentproto"
)

// uploadPrefix names the temporary file an upload is written to before it
// is renamed into place.
const uploadPrefix = ".evalbox-upload-"

// frameBufs holds buffers of a whole frame (header and MaxFrame payload)
// for file transfers and port connections.
var frameBufs = sync.Pool{New: func() any {
	b := make([]byte, agentproto.HeaderSize+agentproto.MaxFrame)
	return &b
}}

// sendChunk is the most data a frame of the agent's carries toward the
// host: whole frames, the largest the host accepts. Under gVisor every read
// and write is a trip through the Sentry, so fewer, larger ones cost the
// sandbox's CPU less: 1 MiB frames, against the 256 KiB of ChunkSize, take
// a quarter less of it per byte of a port URL download (evalbox bench
// network; BENCHMARKS.md).
const sendChunk = agentproto.MaxFrame

// cleanPath checks that p is absolute and free of NUL bytes and cleans it.
// The sandbox's root is the agent's root, so a cleaned absolute path
// cannot leave it ("/.." is "/").
func cleanPath(p string) (string, *agentproto.Error) {
	if !strings.HasPrefix(p, "/") {
		return "", errorf(agentproto.CodeBadRequest, "path %q is not absolute", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errorf(agentproto.CodeBadRequest, "path contains a NUL byte")
	}
	return path.Clean(p), nil
}

// fileInfo describes p from fi (an Lstat result).
func fileInfo(p string, fi fs.FileInfo) agentproto.FileInfo {
	info := agentproto.FileInfo{
		Name:    path.Base(p),
		Path:    p,
		Size:    fi.Size(),
		Mode:    rawMode(fi.Mode()),
		ModTime: fi.ModTime(),
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		info.Type = "file"
	case m.IsDir():
		info.Type = "dir"
	case m&fs.ModeSymlink != 0:
		info.Type = "symlink"
		info.Target, _ = os.Readlink(p)
	default:
		info.Type = "other"
	}
	return info
}

// fileMode converts protocol permission bits (as in chmod: 0o7777) to an
// os.FileMode.
func fileMode(raw uint32) os.FileMode {
	m := os.FileMode(raw & 0o777)
	if raw&syscall.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if raw&syscall.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if raw&syscall.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}

// rawMode is the inverse of fileMode.
func rawMode(m os.FileMode) uint32 {
	raw := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		raw |= syscall.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		raw |= syscall.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		raw |= syscall.S_ISVTX
	}
	return raw
}

// mkdirAll creates directory p and its missing parents (0755), owned by
// owner when not nil, and sets mode exactly on what it creates. An
// existing directory is fine; an existing non-directory is EEXIST.
func mkdirAll(p string, mode os.FileMode, owner *identity) error {
	fi, err := os.Stat(p)
	if err == nil {
		if fi.IsDir() {
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: p, Err: syscall.EEXIST}
	}
	if !isNotExist(err) {
		return err
	}
	if parent := path.Dir(p); parent != p {
		if err := mkdirAll(parent, 0o755, owner); err != nil {
			return err
		}
	}
	return mkdir(p, mode, owner, true)
}

// mkdir creates directory p with exactly mode, owned by owner. With
// existOK, losing a race to another creator is fine.
func mkdir(p string, mode os.FileMode, owner *identity, existOK bool) error {
	if err := os.Mkdir(p, mode); err != nil {
		if existOK && errors.Is(err, fs.ErrExist) {
			if fi, serr := os.Stat(p); serr == nil && fi.IsDir() {
				return nil
			}
		}
		return err
	}
	// Chown first: it clears the setuid and setgid bits. Then set the bits
	// asked for (Mkdir applied the umask).
	if owner != nil {
		if err := owner.chown(p); err != nil {
			return err
		}
	}
	return os.Chmod(p, mode)
}

// opWriteFile receives an upload into a temporary file next to the target
// and renames it into place after the last byte: the file appears whole
// or not at all.
func (s *server) opWriteFile(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	p, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	if p == "/" {
		return fail(errorf(agentproto.CodeIsDir, "/: is a directory"))
	}
	if req.MaxBytes < 0 {
		return fail(errorf(agentproto.CodeBadRequest, "negative max_bytes"))
	}
	owner, perr := s.owner(req.User)
	if perr != nil {
		return fail(perr)
	}
	if req.Recursive {
		if err := mkdirAll(path.Dir(p), 0o755, owner); err != nil {
			return fail(fsError(p, err))
		}
	}
	// A symlink at the path is replaced, never followed: the agent writes
	// as root, and code in the sandbox may have planted the link to make
	// an upload overwrite (and hand over) a file it could not write.
	target, mode := p, fileMode(req.Mode)
	if fi, err := os.Lstat(p); err == nil {
		if fi.IsDir() {
			return fail(errorf(agentproto.CodeIsDir, "%s: is a directory", p))
		}
		if mode == 0 && fi.Mode().IsRegular() {
			mode = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		}
	}
	if mode == 0 {
		mode = 0o644
	}

	f, err := os.CreateTemp(path.Dir(target), uploadPrefix+"*")
	if err != nil {
		return fail(fsError(p, err))
	}
	tmp := f.Name()
	closed, committed := false, false
	defer func() {
		if !closed {
			f.Close()
		}
		if !committed {
			os.Remove(tmp)
		}
	}()

	bufp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bufp)
	var written int64
	for done := false; !done; {
		kind, payload, err := agentproto.ReadFrame(st, *bufp)
		if err != nil {
			// The host went away or aborted: nobody waits for an answer.
			return fail(errorf(agentproto.CodeBadRequest, "upload aborted"))
		}
		switch kind {
		case agentproto.KindData:
			written += int64(len(payload))
			if req.MaxBytes > 0 && written > req.MaxBytes {
				return fail(errorf(agentproto.CodeTooLarge, "%s: upload larger than %d bytes", p, req.MaxBytes))
			}
			if _, err := f.Write(payload); err != nil {
				return fail(fsError(p, err))
			}
		case agentproto.KindEnd:
			done = true
		default:
			return fail(errorf(agentproto.CodeBadRequest, "unexpected frame kind %q in upload", kind))
		}
	}
	// Chown first: it clears the setuid and setgid bits.
	if owner != nil {
		if err := f.Chown(int(owner.uid), int(owner.gid)); err != nil {
			return fail(fsError(p, err))
		}
	}
	if err := f.Chmod(mode); err != nil {
		return fail(fsError(p, err))
	}
	closed = true
	if err := f.Close(); err != nil {
		return fail(fsError(p, err))
	}
	if err := os.Rename(tmp, target); err != nil {
		return fail(fsError(p, err))
	}
	committed = true
	fi, err := os.Lstat(p)
	if err != nil {
		return fail(fsError(p, err))
	}
	info := fileInfo(p, fi)
	return &agentproto.Response{File: &info, Written: written}
}

// opReadFile answers with the file's metadata, then streams its content.
func (s *server) opReadFile(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	p, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	// Opening a FIFO would block until a writer comes; a socket cannot be
	// opened at all.
	if fi, err := os.Stat(p); err == nil && fi.Mode()&(fs.ModeNamedPipe|fs.ModeSocket) != 0 {
		return fail(errorf(agentproto.CodeBadRequest, "%s: not a regular file", p))
	}
	f, err := os.Open(p)
	if err != nil {
		return fail(fsError(p, err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(fsError(p, err))
	}
	if fi.IsDir() {
		return fail(errorf(agentproto.CodeIsDir, "%s: is a directory", p))
	}
	info := fileInfo(p, fi)
	if err := agentproto.WriteJSON(st, agentproto.KindResponse, &agentproto.Response{File: &info}); err != nil {
		return nil
	}
	_, stop := watchPeer(st)
	defer stop()

	var r io.Reader = f
	if fi.Mode().IsRegular() && fi.Size() > 0 {
		// Exactly the size announced, even if the file grows meanwhile.
		r = io.LimitReader(f, fi.Size())
	}
	bufp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bufp)
	buf := (*bufp)[:agentproto.HeaderSize+sendChunk]
	for {
		n, err := r.Read(buf[agentproto.HeaderSize:])
		if n > 0 {
			agentproto.PutHeader(buf, agentproto.KindData, n)
			if _, werr := st.Write(buf[:agentproto.HeaderSize+n]); werr != nil {
				return nil
			}
		}
		if err == io.EOF {
			agentproto.WriteFrame(st, agentproto.KindEnd, nil)
			return nil
		}
		if err != nil {
			return fail(fsError(p, err))
		}
	}
}

// opStat describes a path without following a final symlink.
func (s *server) opStat(req *agentproto.Request) *agentproto.Response {
	p, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fail(fsError(p, err))
	}
	info := fileInfo(p, fi)
	return &agentproto.Response{File: &info}
}

// opListDir lists a directory, sorted by name.
func (s *server) opListDir(req *agentproto.Request) *agentproto.Response {
	p, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return fail(fsError(p, err))
	}
	files := make([]agentproto.FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		files = append(files, fileInfo(path.Join(p, e.Name()), fi))
	}
	return &agentproto.Response{Files: files}
}

// opMkdir creates a directory (and its parents with Recursive).
func (s *server) opMkdir(req *agentproto.Request) *agentproto.Response {
	p, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	owner, perr := s.owner(req.User)
	if perr != nil {
		return fail(perr)
	}
	mode := fileMode(req.Mode)
	if mode == 0 {
		mode = 0o755
	}
	var err error
	if req.Recursive {
		err = mkdirAll(p, mode, owner)
	} else {
		err = mkdir(p, mode, owner, false)
	}
	if err != nil {
		return fail(fsError(p, err))
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fail(fsError(p, err))
	}
	info := fileInfo(p, fi)
	return &agentproto.Response{File: &info}
}

// opRename moves a file or directory (rename(2): a file or an empty
// directory at the target is replaced).
func (s *server) opRename(req *agentproto.Request) *agentproto.Response {
	from, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	to, perr := cleanPath(req.Target)
	if perr != nil {
		return fail(perr)
	}
	if from == "/" || to == "/" {
		return fail(errorf(agentproto.CodeBadRequest, "refusing to move / or onto it"))
	}
	if err := os.Rename(from, to); err != nil {
		var le *os.LinkError
		if errors.As(err, &le) {
			err = le.Err
		}
		switch {
		case errors.Is(err, syscall.EINVAL):
			return fail(errorf(agentproto.CodeBadRequest, "cannot move %s into itself (%s)", from, to))
		case errors.Is(err, syscall.EXDEV):
			return fail(errorf(agentproto.CodeBadRequest, "%s and %s are on different filesystems", from, to))
		case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
			return fail(errorf(agentproto.CodeExists, "%s is a directory that is not empty", to))
		case errors.Is(err, fs.ErrNotExist):
			return fail(errorf(agentproto.CodeNotFound, "%s (or the directory of %s) does not exist", from, to))
		}
		return fail(fsError(from, err))
	}
	fi, err := os.Lstat(to)
	if err != nil {
		return fail(fsError(to, err))
	}
	info := fileInfo(to, fi)
	return &agentproto.Response{File: &info}
}

// opRemove removes a file, an empty directory, or with Recursive a tree.
func (s *server) opRemove(req *agentproto.Request) *agentproto.Response {
	p, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	if p == "/" {
		return fail(errorf(agentproto.CodeBadRequest, "refusing to remove /"))
	}
	if _, err := os.Lstat(p); err != nil {
		return fail(fsError(p, err))
	}
	var err error
	if req.Recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		return fail(fsError(p, err))
	}
	return &agentproto.Response{}
}
