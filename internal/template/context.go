package template

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/pkg/client"
)

// ContextError is a build context (or image upload) that cannot be used;
// its message says why.
type ContextError struct {
	Msg      string
	TooLarge bool
}

func (e *ContextError) Error() string { return e.Msg }

// ExtractContext unpacks a build context (a tar stream from the client)
// into dir, which must exist and be empty. Members are owned by root;
// absolute names, ".." and device files are refused, and nothing is ever
// written through a symlink. maxBytes bounds the files' total size.
func ExtractContext(r io.Reader, dir string, maxBytes int64) error {
	_, err := extractTar(r, dir, extractOptions{maxBytes: maxBytes})
	if err == nil {
		return nil
	}
	if errors.Is(err, errTooLarge) {
		return &ContextError{Msg: fmt.Sprintf("build context: over the maximum of %d bytes", maxBytes), TooLarge: true}
	}
	return &ContextError{Msg: "build context: " + describeTarError(err)}
}

// CheckContext checks that every copy source of spec is in the build
// context in dir ("" = none was sent) and that what it copies stays
// inside: no source reached through a symlink, no symlink that points
// outside the context (absolute, or climbing above its root).
func CheckContext(spec client.TemplateSpec, dir string) error {
	for i, st := range spec.Steps {
		if st.Copy == nil {
			continue
		}
		src, err := contextPath(st.Copy.Src)
		if err != nil {
			return specErrorf("step %d: copy: %v", i+1, err)
		}
		if dir == "" {
			return specErrorf("step %d: copy %s: no build context was sent", i+1, st.Copy.Src)
		}
		if err := checkSource(dir, src); err != nil {
			return specErrorf("step %d: copy %s: %v", i+1, st.Copy.Src, err)
		}
	}
	return nil
}

func checkSource(dir, src string) error {
	// Every parent of src must be a real directory of the context.
	cur := dir
	if src != "." {
		parts := strings.Split(src, "/")
		for i, p := range parts {
			cur = filepath.Join(cur, p)
			fi, err := os.Lstat(cur)
			if errors.Is(err, fs.ErrNotExist) {
				return errors.New("not found in the build context")
			}
			if err != nil {
				return err
			}
			if i < len(parts)-1 && fi.Mode()&fs.ModeSymlink != 0 {
				return fmt.Errorf("%s is a symlink: sources are not reached through symlinks", strings.Join(parts[:i+1], "/"))
			}
		}
	}
	return filepath.WalkDir(cur, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if path.IsAbs(target) {
			return fmt.Errorf("%s is a symlink to the absolute path %s, outside the build context", rel, target)
		}
		resolved := path.Clean(path.Join(path.Dir(filepath.ToSlash(rel)), target))
		if resolved == ".." || strings.HasPrefix(resolved, "../") {
			return fmt.Errorf("%s is a symlink to %s, outside the build context", rel, target)
		}
		return nil
	})
}

// hashSource is the content hash of what a copy step copies: names, types,
// permission bits, symlink targets and file contents (not times nor
// owners, which the copy does not keep), in a fixed order.
func hashSource(dir, src string) (string, error) {
	h := sha256.New()
	root := filepath.Join(dir, src)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %s %s", rel, info.Mode().Type().String(), strconv.FormatUint(uint64(info.Mode().Perm()|info.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)), 8))
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", t)
		case d.Type().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " %d ", info.Size())
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
		}
		h.Write([]byte{'\n'})
		return nil
	})
	if err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
