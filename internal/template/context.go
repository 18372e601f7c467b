package template

import (
	"archive/tar"
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

// ContextLimits bound a build context.
type ContextLimits struct {
	// MaxBytes bounds the total size of its files (0: 64 GiB), MaxEntries
	// its members (0: 1,000,000).
	MaxBytes   int64
	MaxEntries int
	// Charge, if set, is told the size of each file before it is written
	// (ExtractContext); its error is returned, wrapped.
	Charge func(n int64) error
}

func (l ContextLimits) options() extractOptions {
	return extractOptions{maxBytes: l.MaxBytes, maxEntries: l.MaxEntries, charge: l.Charge}.withDefaults()
}

// contextError turns an extraction or scan error into a ContextError.
func contextError(err error, o extractOptions) error {
	if errors.Is(err, errTooLarge) {
		msg := fmt.Sprintf("build context: over the maximum of %d bytes", o.maxBytes)
		if err != errTooLarge {
			// Another bound: the error says which.
			msg = "build context: " + strings.TrimPrefix(err.Error(), errTooLarge.Error()+": ")
		}
		return &ContextError{Msg: msg, TooLarge: true}
	}
	return &ContextError{Msg: "build context: " + describeTarError(err)}
}

// ExtractContext unpacks a build context (a tar stream from the client)
// into dir, which must exist and be empty. Members are owned by root;
// absolute names, "..", devices and sparse files are refused, and nothing
// is ever written through a symlink. Errors about the archive are
// *ContextError; lim.Charge's are returned as they are.
func ExtractContext(r io.Reader, dir string, lim ContextLimits) error {
	o := lim.options()
	var cerr error
	if o.charge != nil {
		charge := o.charge
		o.charge = func(n int64) error {
			cerr = charge(n)
			return cerr
		}
	}
	_, err := extractTar(r, dir, o)
	switch {
	case err == nil:
		return nil
	case cerr != nil:
		return cerr
	}
	return contextError(err, o)
}

// ScanContext copies a build context (a tar stream from the client) to w
// as it reads it, without unpacking it, and checks it: every member as
// ExtractContext will take it (names, types, sizes, the number of
// members), and every copy source of spec as CheckContext will (in the
// context, not reached through a symlink, no symlink under it pointing out
// of the context). A context it passes may still fail to unpack or check
// (a member under a file, a hard link to a symlink): ExtractContext and
// CheckContext on the result are the authority. Errors about the archive
// are *ContextError, about the copy sources *SpecError; w's are returned
// as they are.
func ScanContext(r io.Reader, w io.Writer, spec client.TemplateSpec, lim ContextLimits) error {
	o := lim.options()
	type source struct {
		step  int
		src   string // as written in the spec
		clean string
		found bool
	}
	var srcs []*source
	for i, st := range spec.Steps {
		if st.Copy == nil {
			continue
		}
		c, err := contextPath(st.Copy.Src)
		if err != nil {
			return specErrorf("step %d: copy: %v", i+1, err)
		}
		srcs = append(srcs, &source{step: i + 1, src: st.Copy.Src, clean: c, found: c == "."})
	}
	// Headers and PAX records come on top of the files' bytes: the copy is
	// bounded too.
	tee := &teeReader{r: r, w: w, max: o.maxBytes + int64(o.maxEntries)*2048}
	tr := tar.NewReader(tee)
	var total int64
	for n := 1; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if tee.err != nil {
			if errors.Is(tee.err, errTooLarge) {
				return contextError(tee.err, o)
			}
			return tee.err
		}
		if err != nil {
			return contextError(fmt.Errorf("reading the archive: %w", err), o)
		}
		if n > o.maxEntries {
			return contextError(fmt.Errorf("%w: more than %d members", errTooLarge, o.maxEntries), o)
		}
		rel, err := checkMember(hdr, false)
		if err != nil {
			return contextError(err, o)
		}
		if hdr.Typeflag == tar.TypeReg {
			if total += hdr.Size; total > o.maxBytes {
				return contextError(errTooLarge, o)
			}
		}
		for _, s := range srcs {
			under := s.clean == "." || rel == s.clean || strings.HasPrefix(rel, s.clean+"/")
			if under {
				s.found = true
			}
			if hdr.Typeflag != tar.TypeSymlink {
				continue
			}
			if strings.HasPrefix(s.clean, rel+"/") {
				return specErrorf("step %d: copy %s: %s is a symlink: sources are not reached through symlinks", s.step, s.src, rel)
			}
			if under {
				if err := symlinkInside(rel, hdr.Linkname); err != nil {
					return specErrorf("step %d: copy %s: %v", s.step, s.src, err)
				}
			}
		}
	}
	// The copy ends with the end marker: what may follow it (padding to a
	// record) is of no use.
	for _, s := range srcs {
		if !s.found {
			return specErrorf("step %d: copy %s: not found in the build context", s.step, s.src)
		}
	}
	return nil
}

// symlinkInside checks that the symlink rel (relative to the context's
// root) to target does not point outside the context.
func symlinkInside(rel, target string) error {
	if path.IsAbs(target) {
		return fmt.Errorf("%s is a symlink to the absolute path %s, outside the build context", rel, target)
	}
	resolved := path.Clean(path.Join(path.Dir(rel), target))
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return fmt.Errorf("%s is a symlink to %s, outside the build context", rel, target)
	}
	return nil
}

// teeReader is io.TeeReader of at most max bytes, keeping the writer's
// error (or errTooLarge) apart.
type teeReader struct {
	r   io.Reader
	w   io.Writer
	n   int64
	max int64
	err error
}

func (t *teeReader) Read(p []byte) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	n, err := t.r.Read(p)
	if n > 0 {
		if t.n += int64(n); t.n > t.max {
			t.err = fmt.Errorf("%w: over %d bytes of archive", errTooLarge, t.max)
			return 0, t.err
		}
		if _, werr := t.w.Write(p[:n]); werr != nil {
			t.err = werr
			return 0, werr
		}
	}
	return n, err
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
		return symlinkInside(filepath.ToSlash(rel), target)
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
