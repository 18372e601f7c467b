package template

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// inode identifies a file on the host.
type inode [2]uint64

// storageBytes is what the root filesystem rootfs counts against its
// team's storage: the bytes of its regular files, each inode once, but for
// the files it shares (hard links) with a built-in's root filesystem,
// which every team has anyway. A built template hard-links the files of
// its base (flatten), an import writes its own.
func (r *Registry) storageBytes(rootfs string) (int64, error) {
	shared, err := r.builtinInodes()
	if err != nil {
		return 0, err
	}
	seen := map[inode]bool{}
	var n int64
	err = filepath.WalkDir(rootfs, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		k := inode{st.Dev, st.Ino}
		if seen[k] {
			return nil
		}
		seen[k] = true
		if st.Nlink > 1 && shared[k] {
			return nil
		}
		n += st.Size
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("template: storage of %s: %w", rootfs, err)
	}
	return n, nil
}

// builtinInodes returns the regular files of the built-ins' root
// filesystems, cached until the set of built-ins changes.
func (r *Registry) builtinInodes() (map[inode]bool, error) {
	builtins, err := r.List()
	if err != nil {
		return nil, err
	}
	var digests []string
	for _, t := range builtins {
		digests = append(digests, t.Digest)
	}
	sort.Strings(digests)
	key := strings.Join(digests, ",")
	r.mu.Lock()
	if r.builtinSet != nil && r.builtinKey == key {
		set := r.builtinSet
		r.mu.Unlock()
		return set, nil
	}
	r.mu.Unlock()
	set := map[inode]bool{}
	for _, t := range builtins {
		err := filepath.WalkDir(t.RootFS, func(_ string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				set[inode{st.Dev, st.Ino}] = true
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("template: built-in %s: %w", t.Name, err)
		}
	}
	r.mu.Lock()
	r.builtinSet, r.builtinKey = set, key
	r.mu.Unlock()
	return set, nil
}

// StorageBytes is what the stored template t counts against a team's
// storage (Template.StorageBytes; for a template stored before it was
// recorded, its size). Built-ins count nothing.
func StorageBytes(t *Template) int64 {
	switch {
	case t.Source == SourceBuiltin:
		return 0
	case t.StorageBytes > 0:
		return t.StorageBytes
	}
	return t.SizeBytes
}
