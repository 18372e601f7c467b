package template

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// copyAttrs are a copy step's owner and mode, applied to what it copies.
type copyAttrs struct {
	owner    string // "user" or "user:group", names or ids; "" = root
	mode     string // octal; "" = the files' own
	uid, gid int
	perm     fs.FileMode
}

// resolve reads the owner's ids from root's /etc/passwd and /etc/group
// (read inside root: their symlinks never lead out of it).
func (a *copyAttrs) resolve(root string) error {
	if a.mode != "" {
		m, err := ParseMode(a.mode)
		if err != nil {
			return err
		}
		a.perm = m
	}
	if a.owner == "" {
		return nil
	}
	user, group, hasGroup := strings.Cut(a.owner, ":")
	uid, pgid, err := lookupID(root, "/etc/passwd", user)
	if err != nil {
		return fmt.Errorf("owner %s: %w", a.owner, err)
	}
	a.uid, a.gid = uid, pgid
	if hasGroup {
		if a.gid, _, err = lookupID(root, "/etc/group", group); err != nil {
			return fmt.Errorf("owner %s: %w", a.owner, err)
		}
	} else if pgid < 0 {
		a.gid = uid // a numeric uid that has no passwd entry: its own number
	}
	return nil
}

// lookupID finds name (or a number) in a passwd- or group-style file of
// root: its id and, for passwd, its primary group (-1 when the number is
// not listed).
func lookupID(root, file, name string) (id, gid int, err error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		if n > maxID {
			return 0, 0, fmt.Errorf("id %s is over %d", name, maxID)
		}
		id, gid = int(n), -1
	} else if strings.Trim(name, "0123456789") == "" {
		return 0, 0, fmt.Errorf("id %s is over %d", name, maxID)
	}
	f, err := openInRoot(root, strings.TrimPrefix(file, "/"))
	if err != nil {
		if gid == -1 && errors.Is(err, fs.ErrNotExist) {
			return id, gid, nil
		}
		return 0, 0, fmt.Errorf("reading the template's %s: %w", file, unwrapPath(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 8<<20))
	if err != nil {
		return 0, 0, fmt.Errorf("reading %s: %w", file, err)
	}
	numeric := gid == -1
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 3 {
			continue
		}
		n, err := strconv.Atoi(f[2])
		if err != nil || (numeric && n != id) || (!numeric && f[0] != name) {
			continue
		}
		g := -1
		if len(f) >= 4 {
			if v, err := strconv.Atoi(f[3]); err == nil {
				g = v
			}
		}
		return n, g, nil
	}
	if numeric {
		return id, -1, nil
	}
	return 0, 0, fmt.Errorf("no %q in the template's %s", name, file)
}

// maxID is the largest uid or gid (2^32-1 means "no change" to chown).
const maxID = 1<<32 - 2

// unwrapPath drops the host path a *fs.PathError carries (the caller
// names the file as the sandbox sees it).
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// apply gives p the owner and mode (a symlink: the owner only).
func (a *copyAttrs) apply(p string, fi fs.FileInfo) error {
	if a.owner != "" {
		if err := os.Lchown(p, a.uid, a.gid); err != nil {
			return err
		}
	}
	if a.mode != "" && fi.Mode()&fs.ModeSymlink == 0 {
		return os.Chmod(p, a.perm)
	}
	return nil
}

// applyTree applies a to p and everything under it.
func (a *copyAttrs) applyTree(p string) error {
	return filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return a.apply(q, fi)
	})
}

// buildCopyLayer makes, in the empty directory layer, the layer of a copy
// step: src of the build context ctxDir placed at dst. dst is resolved in
// root, the merged view of the layers below (its symlinks followed inside
// root, as the sandbox would); a relative dst is relative to workdir.
// Directories on the way that exist below keep their metadata; new ones
// are root's, 0755. Copied files are owned by root and keep their mode,
// unless attrs says otherwise (nil: nothing).
func buildCopyLayer(layer, root, ctxDir, src, dst, workdir string, attrs *copyAttrs) error {
	if attrs != nil && attrs.owner == "" && attrs.mode == "" {
		attrs = nil
	}
	if attrs != nil {
		if err := attrs.resolve(root); err != nil {
			return err
		}
	}
	// With attributes to set, files are copied, never linked: a link
	// would share its inode (and the change) with the context and with
	// other steps' layers.
	link := attrs == nil
	srcPath := filepath.Join(ctxDir, src)
	sst, err := os.Lstat(srcPath)
	if err != nil {
		return fmt.Errorf("source %s: %w", src, err)
	}
	if !path.IsAbs(dst) {
		dst = path.Join(workdir, dst)
	}
	intoDir := strings.HasSuffix(dst, "/")
	resolved, err := resolveIn(root, path.Clean(dst))
	if err != nil {
		return fmt.Errorf("destination %s: %w", dst, err)
	}
	existing, err := os.Lstat(filepath.Join(root, resolved))
	exists := err == nil
	target := resolved
	if sst.IsDir() {
		if exists && !existing.IsDir() {
			return fmt.Errorf("destination %s exists and is not a directory", dst)
		}
	} else if intoDir || (exists && existing.IsDir()) {
		target = path.Join(resolved, filepath.Base(srcPath))
	}
	// The directories down to the target (the target too when copying a
	// directory).
	dirs := path.Dir(target)
	if sst.IsDir() {
		dirs = target
	}
	if err := makeParents(layer, root, dirs); err != nil {
		return err
	}
	if sst.IsDir() {
		if !exists {
			if err := os.Chmod(filepath.Join(layer, target), sst.Mode().Perm()); err != nil {
				return err
			}
		}
		if err := copyTree(srcPath, filepath.Join(layer, target), link); err != nil {
			return err
		}
		if attrs == nil {
			return nil
		}
		// What was copied: the directory itself when the step made it,
		// and its content.
		if !exists {
			fi, err := os.Lstat(filepath.Join(layer, target))
			if err != nil {
				return err
			}
			if err := attrs.apply(filepath.Join(layer, target), fi); err != nil {
				return err
			}
		}
		entries, err := os.ReadDir(srcPath)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := attrs.applyTree(filepath.Join(layer, target, e.Name())); err != nil {
				return err
			}
		}
		return nil
	}
	if err := copyEntry(srcPath, filepath.Join(layer, target), sst, link); err != nil {
		return err
	}
	if attrs != nil {
		return attrs.apply(filepath.Join(layer, target), sst)
	}
	return nil
}

// resolveIn resolves the absolute path p inside root the way the sandbox
// would see it: symlinks of existing components are followed (absolute
// targets relative to root, never above it). Components that do not exist
// are kept as they are.
func resolveIn(root, p string) (string, error) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	hops := 0
	for len(parts) > 0 {
		c := parts[0]
		parts = parts[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if errors.Is(err, fs.ErrNotExist) {
			return path.Join(append([]string{next}, parts...)...), nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if hops++; hops > 40 {
				return "", errors.New("too many levels of symbolic links")
			}
			t, err := os.Readlink(filepath.Join(root, next))
			if err != nil {
				return "", err
			}
			if path.IsAbs(t) {
				cur = "/"
			}
			parts = append(strings.Split(t, "/"), parts...)
			continue
		}
		if !fi.IsDir() && len(parts) > 0 {
			return "", fmt.Errorf("%s is not a directory", next)
		}
		cur = next
	}
	return cur, nil
}

// makeParents makes the directory dir (absolute, resolved) and its parents
// in layer, with the metadata of the same directories in root when they
// exist there.
func makeParents(layer, root, dir string) error {
	cur := "/"
	for _, c := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if c == "" {
			continue
		}
		cur = path.Join(cur, c)
		lp := filepath.Join(layer, cur)
		if fi, err := os.Lstat(lp); err == nil && fi.IsDir() {
			continue
		}
		if err := os.Mkdir(lp, 0o755); err != nil {
			return err
		}
		if st, err := lstat(filepath.Join(root, cur)); err == nil && isDir(st) {
			if err := copyMeta(lp, filepath.Join(root, cur), st); err != nil {
				return err
			}
		}
	}
	// The layer's root carries the root directory's metadata.
	st, err := lstat(root)
	if err != nil {
		return err
	}
	return copyMeta(layer, root, st)
}

// copyTree copies the content of the directory src into the existing
// directory dst; regular files are hard links when link is set.
func copyTree(src, dst string, link bool) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		fi, err := os.Lstat(s)
		if err != nil {
			return err
		}
		if err := copyEntry(s, d, fi, link); err != nil {
			return err
		}
	}
	return nil
}

// copyEntry copies one context entry to dst as root's: a directory with
// its content, a regular file (a hard link when link is set and it can
// be), or a symlink.
func copyEntry(src, dst string, fi fs.FileInfo, link bool) error {
	// A file that exists in the layer already (copied by this step) is
	// replaced.
	if old, err := os.Lstat(dst); err == nil && !(old.IsDir() && fi.IsDir()) {
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
	}
	switch {
	case fi.IsDir():
		if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := copyTree(src, dst, link); err != nil {
			return err
		}
		return chmodTimes(dst, fi)
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(t, dst)
	case fi.Mode().IsRegular():
		st, err := lstat(src)
		if err != nil {
			return err
		}
		// Context files are root's already (ExtractContext) and removed
		// after the build: a hard link is the copy, when it can be made.
		if link {
			if err := os.Link(src, dst); err == nil {
				return nil
			}
		}
		return copyFile(src, dst, st)
	}
	return fmt.Errorf("%s: not a file, directory or symlink", src)
}

func chmodTimes(p string, fi fs.FileInfo) error {
	if err := os.Lchown(p, 0, 0); err != nil {
		return err
	}
	// Directories only: files are linked or copied with their (set-id
	// free, see entryMode) modes.
	if err := os.Chmod(p, fi.Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	ts := unix.NsecToTimespec(fi.ModTime().UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}
