package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// buildCopyLayer makes, in the empty directory layer, the layer of a copy
// step: src of the build context ctxDir placed at dst. dst is resolved in
// root, the merged view of the layers below (its symlinks followed inside
// root, as the sandbox would); a relative dst is relative to workdir.
// Directories on the way that exist below keep their metadata; new ones
// are root's, 0755. Copied files are owned by root and keep their mode.
func buildCopyLayer(layer, root, ctxDir, src, dst, workdir string) error {
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
		return copyTree(srcPath, filepath.Join(layer, target))
	}
	return copyEntry(srcPath, filepath.Join(layer, target), sst)
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
// directory dst.
func copyTree(src, dst string) error {
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
		if err := copyEntry(s, d, fi); err != nil {
			return err
		}
	}
	return nil
}

// copyEntry copies one context entry to dst as root's: a directory with
// its content, a regular file, or a symlink.
func copyEntry(src, dst string, fi fs.FileInfo) error {
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
		if err := copyTree(src, dst); err != nil {
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
		if err := os.Link(src, dst); err == nil {
			return nil
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
