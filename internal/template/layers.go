package template

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A layer is a directory in overlayfs format: what a build step changed.
// A file deleted by the step is a whiteout (a 0/0 character device), a
// directory that replaced a lower one carries trusted.overlay.opaque=y.

// isWhiteout reports whether st is an overlayfs whiteout.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// isOpaque reports whether the directory p hides the lower layers'.
func isOpaque(p string) bool {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(p, opaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// mountOverlay mounts a read-only overlay of dirs (top first, at least
// two) at target. The mount is private to this host's mount table under
// the store's work area and must be undone with unmount.
func mountOverlay(target string, dirs []string) error {
	if len(dirs) < 2 {
		return errors.New("an overlay needs at least two layers")
	}
	for _, d := range dirs {
		if strings.ContainsAny(d, ",:\\") {
			return fmt.Errorf("layer path %q has one of , : \\", d)
		}
	}
	opts := "lowerdir=" + strings.Join(dirs, ":")
	// The kernel takes at most a page of mount options.
	if len(opts) > 4000 {
		return fmt.Errorf("too many layers (%d) for one overlay mount; use fewer run and copy steps, or build from an intermediate template", len(dirs)-1)
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mount overlay of %d layers: %w", len(dirs), err)
	}
	return nil
}

func unmount(target string) error {
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	return nil
}

// flatten merges layers (top first) over base into dst, which must not
// exist: the view an overlay mount of them would show, as one plain
// directory tree. Files are hard-linked from the layers and base when they
// are on the same filesystem, else copied; directories are made fresh with
// the metadata of their topmost layer. Whiteouts and opaque markers are
// consumed, never copied.
func flatten(dst string, layers []string, base string) error {
	srcs := append(append([]string(nil), layers...), base)
	st, err := lstat(srcs[0])
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	return mergeDir(dst, srcs, st)
}

func lstat(p string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: p, Err: err}
	}
	return &st, nil
}

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

// mergeDir fills the directory dst (already made) from srcs, the same
// directory in each layer (top first), then gives it the metadata of the
// topmost (st).
func mergeDir(dst string, srcs []string, st *unix.Stat_t) error {
	// An opaque directory hides the layers below it.
	for i, s := range srcs {
		if i < len(srcs)-1 && isOpaque(s) {
			srcs = srcs[:i+1]
			break
		}
	}
	type item struct {
		path string
		st   *unix.Stat_t
	}
	layers := make([]map[string]item, len(srcs))
	var names []string
	seen := map[string]bool{}
	for i, s := range srcs {
		ents, err := os.ReadDir(s)
		if err != nil {
			return err
		}
		layers[i] = make(map[string]item, len(ents))
		for _, e := range ents {
			p := filepath.Join(s, e.Name())
			est, err := lstat(p)
			if err != nil {
				return err
			}
			layers[i][e.Name()] = item{p, est}
			if !seen[e.Name()] {
				seen[e.Name()] = true
				names = append(names, e.Name())
			}
		}
	}
	sort.Strings(names)
	for _, name := range names {
		// The topmost entry wins; a directory merges with the directories
		// right below it, down to a whiteout or a non-directory.
		var top *item
		var stack []string
		for i := range srcs {
			it, ok := layers[i][name]
			if !ok {
				continue
			}
			if isWhiteout(it.st) || (top != nil && !isDir(it.st)) {
				break
			}
			if top == nil {
				top = &it
			}
			if !isDir(it.st) {
				break
			}
			stack = append(stack, it.path)
		}
		if top == nil {
			continue
		}
		target := filepath.Join(dst, name)
		if isDir(top.st) {
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			if err := mergeDir(target, stack, top.st); err != nil {
				return err
			}
			continue
		}
		if err := placeFile(top.path, target, top.st); err != nil {
			return err
		}
	}
	return copyMeta(dst, srcs[0], st)
}

// placeFile puts the non-directory src at dst: a hard link when possible,
// else a copy with the same metadata.
func placeFile(src, dst string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := os.Link(src, dst); err == nil {
			return nil
		} else if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, syscall.EMLINK) && !errors.Is(err, syscall.EPERM) {
			return err
		}
		return copyFile(src, dst, st)
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		ts := []unix.Timespec{st.Atim, st.Mtim}
		return unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
	case unix.S_IFIFO, unix.S_IFCHR, unix.S_IFBLK, unix.S_IFSOCK:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", dst, err)
		}
		return copyMeta(dst, src, st)
	}
	return fmt.Errorf("%s: unknown file type %s", src, octal(st.Mode&unix.S_IFMT))
}

func copyFile(src, dst string, st *unix.Stat_t) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return copyMeta(dst, src, st)
}

// copyMeta gives dst (not a symlink) the ownership, mode, xattrs (but
// overlayfs' own) and times of src.
func copyMeta(dst, src string, st *unix.Stat_t) error {
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	if err := copyXattrs(dst, src); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}

// copyXattrs copies the extended attributes of src to dst, except
// overlayfs' (trusted.overlay.*).
func copyXattrs(dst, src string) error {
	buf := make([]byte, 1024)
	n, err := unix.Llistxattr(src, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Llistxattr(src, nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Llistxattr(src, buf)
		}
	}
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return &os.PathError{Op: "listxattr", Path: src, Err: err}
	}
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		if k == "" || strings.HasPrefix(k, "trusted.overlay.") {
			continue
		}
		sz, err := unix.Lgetxattr(src, k, nil)
		if err != nil {
			continue
		}
		v := make([]byte, sz)
		if sz, err = unix.Lgetxattr(src, k, v); err != nil {
			continue
		}
		if err := unix.Lsetxattr(dst, k, v[:sz], 0); err != nil {
			return &os.PathError{Op: "setxattr " + k, Path: dst, Err: err}
		}
	}
	return nil
}
