package template

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// The export stream of a template (Export) is one tar: template.json (the
// template's metadata) first, then rootfs/ and its tree in lexical order.
// It is deterministic: the same template gives the same bytes, so that the
// stream's sha256 (ContentDigest) names its content. A template's Digest
// names its inputs (a build's steps, an image's manifest), not its bytes:
// two builds of one spec may differ, so a node that fetches a template by
// Digest checks what it got against the ContentDigest the control plane
// recorded for it.
//
// Members: directories, regular files, symlinks, hard links (by inode, to
// the first name in walk order) and FIFOs, with owner, mode and mtime (whole
// seconds); no xattrs, no device nodes, no sockets. A node unpacks the
// stream with the same code as a build layer (extractTar: beneath its
// directory, no symlink followed, set-id bits cleared, bounded), so a
// fetched copy has no set-id program and no file capability.
const (
	exportFormat = "template-tar/v1"
	// contentDigestFile caches a template's ContentDigest in its
	// directory, next to template.json (outside the stream it hashes).
	contentDigestFile = "content-digest.json"
)

// DefaultMaxFetchBytes bounds a fetched template's stream (AddFetched with
// max 0): the sizes of its files and its headers.
const DefaultMaxFetchBytes int64 = 32 << 30

// ErrContentMismatch is the error of a fetch whose stream does not hash
// to the content digest asked for.
var ErrContentMismatch = errors.New("template: the fetched stream does not match its content digest")

// contentDigestRecord is contentDigestFile's content.
type contentDigestRecord struct {
	Format        string `json:"format"`
	Digest        string `json:"digest"`
	ContentDigest string `json:"content_digest"`
}

// Export writes t's export stream to w. It reads the template's files as
// it writes: nothing is held in memory but one file's header and a copy
// buffer.
func Export(ctx context.Context, w io.Writer, t *Template) error {
	meta, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("template: export: %w", err)
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: "template.json", Typeflag: tar.TypeReg, Mode: 0o644,
		Size: int64(len(meta)), ModTime: time.Unix(0, 0)}); err != nil {
		return fmt.Errorf("template: export: %w", err)
	}
	if _, err := tw.Write(meta); err != nil {
		return fmt.Errorf("template: export: %w", err)
	}
	links := map[[2]uint64]string{}
	root := t.RootFS
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := "rootfs"
		if rel != "." {
			name = "rootfs/" + filepath.ToSlash(rel)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", p)
		}
		hdr := &tar.Header{Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
			ModTime: time.Unix(st.Mtim.Sec, 0)}
		switch fi.Mode().Type() {
		case fs.ModeDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		case fs.ModeSymlink:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case fs.ModeNamedPipe:
			hdr.Typeflag = tar.TypeFifo
		case 0:
			key := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok && st.Nlink > 1 {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				break
			}
			if st.Nlink > 1 {
				links[key] = name
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		default:
			return nil // devices, sockets: not part of a template
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		// Exactly the size in the header (a file that changed under the
		// export fails it rather than corrupting the stream).
		n, err := io.Copy(tw, io.LimitReader(f, hdr.Size))
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%s: changed during the export", p)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("template: export %s: %w", t.Digest, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("template: export: %w", err)
	}
	return nil
}

// ContentDigest returns the sha256 of the export stream of the template
// with digest d ("sha256:<hex>"), the content hash that a node fetching
// it checks. It is computed at the first call (one pass over the
// template's files) and cached in the template's directory.
func (r *Registry) ContentDigest(ctx context.Context, d string) (string, error) {
	t, err := r.ByDigest(d)
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(t.RootFS)
	if b, err := os.ReadFile(filepath.Join(dir, contentDigestFile)); err == nil {
		var rec contentDigestRecord
		if json.Unmarshal(b, &rec) == nil && rec.Format == exportFormat && rec.Digest == t.Digest && hexOf(rec.ContentDigest) != "" {
			return rec.ContentDigest, nil
		}
	}
	h := sha256.New()
	if err := Export(ctx, h, t); err != nil {
		return "", err
	}
	cd := "sha256:" + hex.EncodeToString(h.Sum(nil))
	b, _ := json.Marshal(contentDigestRecord{Format: exportFormat, Digest: t.Digest, ContentDigest: cd})
	// Written whole or not at all (a rename): a reader never sees half.
	if f, err := os.CreateTemp(dir, ".content-digest-"); err == nil {
		_, werr := f.Write(b)
		cerr := f.Close()
		if werr != nil || cerr != nil || os.Rename(f.Name(), filepath.Join(dir, contentDigestFile)) != nil {
			_ = os.Remove(f.Name())
			r.log.Warn("template: cannot cache a content digest", "template", t.Digest)
		}
	}
	return cd, nil
}

// Digests lists the digests of the templates this registry holds: the
// built-ins that are built and the stored templates.
func (r *Registry) Digests() ([]string, error) {
	var out []string
	bs, err := r.List()
	if err != nil {
		return nil, err
	}
	for _, b := range bs {
		out = append(out, b.Digest)
	}
	if r.store != "" {
		s, err := r.Stored()
		if err != nil {
			return nil, err
		}
		out = append(out, s...)
	}
	return out, nil
}

// AddFetched stores the template of digest d from its export stream r,
// which must hash to contentDigest and be at most max bytes (0:
// DefaultMaxFetchBytes). The stream is unpacked into the store's work area
// as it is read (never held in memory), hashed on the way, and renamed
// into the store only once whole, matching and well formed: any failure
// leaves nothing. A template of d stored already is returned as it is.
func (r *Registry) AddFetched(ctx context.Context, d, contentDigest string, src io.Reader, max int64) (*Template, error) {
	if err := r.needStore(); err != nil {
		return nil, err
	}
	if hexOf(d) == "" || hexOf(contentDigest) == "" {
		return nil, fmt.Errorf("template: fetch: bad digest %q or content digest %q", d, contentDigest)
	}
	if r.HasStored(d) {
		return r.Get(d)
	}
	if max <= 0 {
		max = DefaultMaxFetchBytes
	}
	tmp, err := os.MkdirTemp(filepath.Join(r.store, tmpDir), "fetch-")
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = removeTree(tmp)
		}
	}()
	h := sha256.New()
	in := &hashingReader{ctx: ctx, r: src, h: h, left: max}
	if _, err := extractTar(in, tmp, extractOptions{layer: true, maxBytes: max}); err != nil {
		return nil, fmt.Errorf("template: fetch %s: %w", d, fetchErr(in, err))
	}
	// What follows the tar's end (padding) is part of the stream too.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return nil, fmt.Errorf("template: fetch %s: %w", d, fetchErr(in, err))
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != contentDigest {
		return nil, fmt.Errorf("%w: %s is %s, want %s", ErrContentMismatch, d, got, contentDigest)
	}
	if err := checkFetchedLayout(tmp, d); err != nil {
		return nil, fmt.Errorf("template: fetch %s: %w", d, err)
	}
	if err := os.Chmod(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if err := r.commitStored(tmp, d); err != nil {
		return nil, err
	}
	committed = true
	return r.Get(d)
}

// checkFetchedLayout checks that an unpacked stream is a template of
// digest d: template.json (a regular file naming d) and rootfs/ (a
// directory), and nothing else.
func checkFetchedLayout(dir, d string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch {
		case e.Name() == "template.json" && e.Type().IsRegular():
		case e.Name() == "rootfs" && e.IsDir():
		default:
			return fmt.Errorf("unexpected member %q at the stream's top", e.Name())
		}
	}
	t, err := readTemplate(dir, d)
	if err != nil {
		return err
	}
	if t.Digest != d {
		return fmt.Errorf("the stream is template %q, not %s", t.Digest, d)
	}
	if fi, err := os.Lstat(t.RootFS); err != nil || !fi.IsDir() {
		return errors.New("the stream has no rootfs/ directory")
	}
	return nil
}

// errStreamTooLarge is a stream past its bound.
var errStreamTooLarge = errors.New("the stream is larger than the maximum")

func fetchErr(in *hashingReader, err error) error {
	if in.over {
		return fmt.Errorf("%w (%d bytes)", errStreamTooLarge, in.n-1)
	}
	if errors.Is(err, errTooLarge) {
		return fmt.Errorf("%w: %w", errStreamTooLarge, err)
	}
	return err
}

// hashingReader hashes what it reads, up to left bytes; past them it fails.
type hashingReader struct {
	ctx  context.Context
	r    io.Reader
	h    hash.Hash
	left int64
	n    int64
	over bool
}

func (x *hashingReader) Read(p []byte) (int, error) {
	if err := x.ctx.Err(); err != nil {
		return 0, err
	}
	if x.left <= 0 {
		// One byte more says whether the stream goes on.
		var b [1]byte
		n, err := x.r.Read(b[:])
		if n > 0 {
			x.over, x.n = true, x.n+1
			return 0, errStreamTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > x.left {
		p = p[:x.left]
	}
	n, err := x.r.Read(p)
	x.h.Write(p[:n])
	x.left -= int64(n)
	x.n += int64(n)
	return n, err
}
