package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Directories of the store (UseStore).
const (
	layersDir    = "layers"    // <hex>/: one committed layer, overlayfs format
	templatesDir = "templates" // <hex>/{rootfs,template.json}: built and imported templates
	tmpDir       = "tmp"       // work directories of builds in flight
)

// UseStore opens (creating) the store of built and imported templates and
// of the layer cache in dir. It removes what builds of an earlier process
// left in its work area (unmounting their overlay mounts first).
func (r *Registry) UseStore(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	for _, d := range []string{layersDir, templatesDir, tmpDir} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return fmt.Errorf("template: %w", err)
		}
	}
	r.store = abs
	return r.cleanTmp()
}

// StoreDir is the store's directory ("" before UseStore).
func (r *Registry) StoreDir() string { return r.store }

// cleanTmp unmounts every mount under the store's work area and removes
// its content.
func (r *Registry) cleanTmp() error {
	tmp := filepath.Join(r.store, tmpDir)
	var errs []error
	for _, m := range mountsUnder(tmp) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(tmp, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("template: cleaning %s: %w", tmp, err)
	}
	return nil
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	// Deepest first: longer paths sort after their parents.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + c - '0'
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Mounts lists the mounts builds hold now (tests use it to check that a
// build left none).
func (r *Registry) Mounts() []string {
	if r.store == "" {
		return nil
	}
	return mountsUnder(filepath.Join(r.store, tmpDir))
}

func (r *Registry) needStore() error {
	if r.store == "" {
		return errors.New("template: no store (UseStore was not called)")
	}
	return nil
}

// hexOf returns the hex part of a "sha256:<hex>" digest, or "" if d is not
// one.
func hexOf(d string) string {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return ""
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return ""
		}
	}
	return h
}

func (r *Registry) loadStored(hexDigest string) (*Template, error) {
	if r.store == "" || hexOf("sha256:"+hexDigest) == "" {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, "sha256:"+hexDigest)
	}
	return readTemplate(filepath.Join(r.store, templatesDir, hexDigest), "sha256:"+hexDigest)
}

// layerPath is where the layer with digest d is committed.
func (r *Registry) layerPath(d string) string { return filepath.Join(r.store, layersDir, hexOf(d)) }

// HasLayer reports whether the layer with digest d is in the cache.
func (r *Registry) HasLayer(d string) bool {
	if r.store == "" || hexOf(d) == "" {
		return false
	}
	_, err := os.Lstat(r.layerPath(d))
	return err == nil
}

// Layers lists the digests of the cached layers.
func (r *Registry) Layers() ([]string, error) { return r.digestsIn(layersDir) }

// digestsIn lists the digests named by the entries of a store directory.
func (r *Registry) digestsIn(dir string) ([]string, error) {
	if err := r.needStore(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(r.store, dir))
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	var out []string
	for _, e := range entries {
		if hexOf("sha256:"+e.Name()) != "" {
			out = append(out, "sha256:"+e.Name())
		}
	}
	return out, nil
}

// commitLayer moves a finished layer directory into the cache as digest d.
// If another build committed the same layer first, dir is removed and the
// cached one kept (both came from the same inputs).
func (r *Registry) commitLayer(dir, d string) error {
	err := os.Rename(dir, r.layerPath(d))
	if err != nil && (errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY)) {
		return os.RemoveAll(dir)
	}
	if err != nil {
		return fmt.Errorf("template: commit layer: %w", err)
	}
	r.usage.Store(-1)
	return nil
}

// storedPath is the directory of the stored template with digest d.
func (r *Registry) storedPath(d string) string {
	return filepath.Join(r.store, templatesDir, hexOf(d))
}

// HasStored reports whether a template with digest d is stored.
func (r *Registry) HasStored(d string) bool {
	if r.store == "" || hexOf(d) == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(r.storedPath(d), "template.json"))
	return err == nil
}

// Stored lists the digests of the stored templates.
func (r *Registry) Stored() ([]string, error) { return r.digestsIn(templatesDir) }

// commitStored moves a finished template directory (rootfs/ and
// template.json) into the store under its digest. A template of the same
// digest already there wins (it came from the same inputs).
func (r *Registry) commitStored(dir, d string) error {
	err := os.Rename(dir, r.storedPath(d))
	if err != nil && (errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY)) {
		return removeTree(dir)
	}
	if err != nil {
		return fmt.Errorf("template: commit template: %w", err)
	}
	r.usage.Store(-1)
	return nil
}

// RemoveStored deletes the stored template with digest d. The caller makes
// sure that nothing uses it (no template name points at it, no sandbox
// runs from it).
func (r *Registry) RemoveStored(d string) error {
	remove, err := r.DetachStored(d)
	if err != nil {
		return err
	}
	return remove()
}

// DetachStored takes the stored template with digest d out of the store
// at once (a rename: a crash midway leaves no half template behind) and
// returns the function that deletes its files, which may take a while.
func (r *Registry) DetachStored(d string) (remove func() error, err error) {
	if err := r.needStore(); err != nil {
		return nil, err
	}
	if hexOf(d) == "" {
		return nil, fmt.Errorf("template: bad digest %q", d)
	}
	r.mu.Lock()
	delete(r.cache, d)
	r.mu.Unlock()
	tmp, err := os.MkdirTemp(filepath.Join(r.store, tmpDir), "rm-")
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if err := os.Rename(r.storedPath(d), filepath.Join(tmp, "t")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("template: remove %s: %w", d, err)
	}
	r.usage.Store(-1)
	return func() error { return removeTree(tmp) }, nil
}

// PruneLayers removes cached layers that no stored template lists in its
// Layers (the leftovers of failed or replaced builds). The server calls it
// at start, when no build runs.
func (r *Registry) PruneLayers() (int, error) {
	layers, err := r.Layers()
	if err != nil {
		return 0, err
	}
	keep := map[string]bool{}
	stored, err := r.Stored()
	if err != nil {
		return 0, err
	}
	for _, d := range stored {
		t, err := r.Get(d)
		if err != nil {
			continue
		}
		for _, l := range t.Layers {
			keep[l] = true
		}
	}
	n := 0
	for _, l := range layers {
		if keep[l] {
			continue
		}
		if err := removeTree(r.layerPath(l)); err != nil {
			return n, fmt.Errorf("template: prune layer %s: %w", l, err)
		}
		n++
	}
	if n > 0 {
		r.usage.Store(-1)
	}
	return n, nil
}

// removeTree removes a directory tree; directories made read-only inside
// it (by a build step) are made writable first.
func removeTree(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// DiskUsage is the disk the registry uses: built-ins, stored templates and
// layers, each inode counted once (templates share files with their layers
// and base through hard links). It is cached until the store changes.
func (r *Registry) DiskUsage() (int64, error) {
	if v := r.usage.Load(); v >= 0 {
		return v, nil
	}
	seen := map[[2]uint64]bool{}
	var total int64
	dirs := []string{r.dir}
	if r.store != "" {
		dirs = append(dirs, filepath.Join(r.store, layersDir), filepath.Join(r.store, templatesDir))
	}
	for _, root := range dirs {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			info, err := d.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			st, ok := info.Sys().(*syscall.Stat_t)
			if !ok {
				return nil
			}
			key := [2]uint64{st.Dev, st.Ino}
			if seen[key] {
				return nil
			}
			seen[key] = true
			total += st.Blocks * 512
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("template: disk usage: %w", err)
		}
	}
	r.usage.Store(total)
	return total, nil
}
