package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/evalbox/evalbox/internal/template/tarbomb"
)

// rawLayer is a layer of the uncompressed tar stream b.
func rawLayer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSparseLayersRefused: a sparse entry of a few bytes that claims 2 GiB
// is refused before anything is written (it used to be written out as
// 2 GiB of zeros).
func TestSparseLayersRefused(t *testing.T) {
	for name, bomb := range map[string][]byte{
		"pax": tarbomb.SparsePAX("bomb", 2<<30),
		"gnu": tarbomb.SparseGNU("bomb", 2<<30),
	} {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "img.tar")
			writeArchive(t, src, "example.com/bomb:1", imageOf(t, "", rawLayer(t, bomb)))
			importFails(t, src, ErrInvalidImage, "sparse file")
		})
	}
}

// sparseFile makes a file of size bytes that takes no disk.
func sparseFile(t testing.TB, p string, size int64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// tarWithHuge writes a tar archive of entries, then a member name of size
// bytes (zeros, a hole on disk) and the end marker.
func tarWithHuge(t testing.TB, p string, entries []ent, name string, size int64) {
	t.Helper()
	small := tarBytes(t, entries...)
	small = small[:len(small)-1024] // without its end marker
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: mtime}); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(small)
	f.Write(hdr.Bytes())
	dataEnd := int64(len(small)+hdr.Len()) + (size+511)&^511
	if _, err := f.WriteAt(make([]byte, 1024), dataEnd); err != nil {
		t.Fatal(err)
	}
}

// TestMetadataBounded: the files read whole (index.json, manifest.json,
// manifests, configs) are refused past 4 MiB, by their size, without being
// read.
func TestMetadataBounded(t *testing.T) {
	img := imageOf(t, "", layerOf(t, file("f", "x")))
	const huge = 64 << 20

	t.Run("index.json of a layout directory", func(t *testing.T) {
		src := layoutOf(t, img)
		sparseFile(t, filepath.Join(src, "index.json"), huge)
		importFails(t, src, ErrInvalidImage, "index.json is 67108864 bytes, over the maximum")
	})
	t.Run("index.json of a layout archive", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "layout.tar")
		tarWithHuge(t, p, []ent{file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`)}, "index.json", huge)
		importFails(t, p, ErrInvalidImage, "index.json is 67108864 bytes, over the maximum")
	})
	t.Run("manifest.json of a docker-archive", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "img.tar")
		tarWithHuge(t, p, []ent{file("layer.tar", "")}, "manifest.json", huge)
		importFails(t, p, ErrInvalidImage, "manifest.json is 67108864 bytes, over the maximum")
	})
	t.Run("config of a docker-archive", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "img.tar")
		tarWithHuge(t, p, []ent{file("manifest.json", `[{"Config":"cfg.json","RepoTags":["x:1"],"Layers":[]}]`)}, "cfg.json", huge)
		importFails(t, p, ErrInvalidImage, "cfg.json is 67108864 bytes, over the maximum")
	})
	t.Run("a manifest of a layout", func(t *testing.T) {
		src := layoutOf(t, img)
		sparseFile(t, blobPath(src, mustDigest(t, img)), huge)
		importFails(t, src, ErrInvalidImage, "67108864 bytes, over the maximum")
	})
}

// TestArchiveMembersRefused: what an image archive may not hold.
func TestArchiveMembersRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	layout := tarBytes(t, file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`), file("index.json", `{"schemaVersion":2,"manifests":[]}`))
	importFails(t, write("sparse.tar", tarbomb.Members(layout, tarbomb.SparsePAX("blobs/sha256/x", 1<<40))), ErrInvalidImage, "sparse file")
	importFails(t, write("gnusparse.tar", tarbomb.Members(layout, tarbomb.SparseGNU("blobs/sha256/x", 1<<40))), ErrInvalidImage, "sparse file")
}

// TestLimits: an importer's bounds on bytes (a gzip bomb), entries and
// paths, and its charge.
func TestLimits(t *testing.T) {
	zeros := strings.Repeat("\x00", 8<<20)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarBytes(t, file("zeros", zeros)))
	zw.Close()
	if gz.Len() > 64<<10 {
		t.Fatalf("the bomb is %d bytes", gz.Len())
	}
	bomb := filepath.Join(t.TempDir(), "bomb.tar")
	writeArchive(t, bomb, "example.com/bomb:1", imageOf(t, "", layerOf(t, file("zeros", zeros))))
	many := filepath.Join(t.TempDir(), "many.tar")
	var ents []ent
	for i := range 100 {
		ents = append(ents, file(fmt.Sprintf("f%d", i), "x"))
	}
	writeArchive(t, many, "example.com/many:1", imageOf(t, "", layerOf(t, ents...)))
	deep := filepath.Join(t.TempDir(), "deep.tar")
	writeArchive(t, deep, "example.com/deep:1", imageOf(t, "", layerOf(t,
		file(strings.Repeat("a/", 200)+"f", "x"), file(strings.Repeat("b/", 200)+"f", "x"))))

	fails := func(t *testing.T, im *Importer, src string, charge Charge, want error, msg string) {
		t.Helper()
		dstParent := t.TempDir()
		_, _, err := im.Import(context.Background(), src, "", filepath.Join(dstParent, "rootfs"), charge)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), msg) {
			t.Errorf("err = %v; want %v mentioning %q", err, want, msg)
		}
		assertNothingLeft(t, dstParent)
	}
	t.Run("bytes", func(t *testing.T) {
		fails(t, &Importer{Limits: Limits{MaxBytes: 1 << 20}}, bomb, nil, ErrTooLarge, "over the maximum of 1048576 bytes")
	})
	t.Run("entries", func(t *testing.T) {
		fails(t, &Importer{Limits: Limits{MaxEntries: 10}}, many, nil, ErrTooLarge, "over the maximum of 10 entries")
	})
	t.Run("paths", func(t *testing.T) {
		old := maxPathBytes
		maxPathBytes = 64 << 10
		defer func() { maxPathBytes = old }()
		fails(t, &Importer{}, deep, nil, ErrTooLarge, "too many paths")
	})
	t.Run("charge", func(t *testing.T) {
		errQuota := errors.New("over the team's quota")
		var charged int64
		charge := func(n int64) error {
			if charged+n > 50 {
				return errQuota
			}
			charged += n
			return nil
		}
		fails(t, &Importer{}, many, charge, errQuota, "over the team's quota")
		if charged != 50 {
			t.Errorf("charged %d bytes, want 50", charged)
		}
	})
	t.Run("within", func(t *testing.T) {
		var charged int64
		dst := filepath.Join(t.TempDir(), "rootfs")
		im := &Importer{Limits: Limits{MaxBytes: 9 << 20, MaxEntries: 100}}
		if _, _, err := im.Import(context.Background(), bomb, "", dst, func(n int64) error { charged += n; return nil }); err != nil {
			t.Fatal(err)
		}
		if charged != 8<<20 {
			t.Errorf("charged %d", charged)
		}
	})
}

// TestLayoutReadsStayInside: an uploaded layout's files are read beneath
// it, regular files only: a symlink to a host file is refused without
// anything of that file in the error, and a FIFO (or a symlink to one)
// does not block the import.
func TestLayoutReadsStayInside(t *testing.T) {
	requireRoot(t)
	img := imageOf(t, "", layerOf(t, file("f", "x")))
	secret := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(secret, []byte("Zsecret-key-material\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	noLeak := func(t *testing.T, src, msg string) {
		t.Helper()
		done := make(chan error, 1)
		dstParent := t.TempDir()
		go func() {
			_, _, err := Import(context.Background(), src, "", filepath.Join(dstParent, "rootfs"))
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), msg) {
				t.Errorf("err = %v; want an invalid image mentioning %q", err, msg)
			}
			if err != nil && (strings.Contains(err.Error(), "'Z'") || strings.Contains(err.Error(), "secret-key")) {
				t.Errorf("the error shows the host file: %v", err)
			}
		case <-time.After(20 * time.Second):
			// Unblock the reader so the test can end.
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			t.Fatal("the import blocked")
		}
		assertNothingLeft(t, dstParent)
	}
	replace := func(t *testing.T, p string, with func(string) error) {
		t.Helper()
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := with(p); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("index.json symlinked to a host file", func(t *testing.T) {
		src := layoutOf(t, img)
		replace(t, filepath.Join(src, "index.json"), func(p string) error { return os.Symlink(secret, p) })
		noLeak(t, src, "index.json is a symbolic link")
	})
	t.Run("index.json symlinked relative", func(t *testing.T) {
		src := layoutOf(t, img)
		rel, _ := filepath.Rel(src, secret)
		replace(t, filepath.Join(src, "index.json"), func(p string) error { return os.Symlink(rel, p) })
		noLeak(t, src, "index.json is a symbolic link")
	})
	t.Run("a manifest symlinked to a host file", func(t *testing.T) {
		src := layoutOf(t, img)
		replace(t, blobPath(src, mustDigest(t, img)), func(p string) error { return os.Symlink(secret, p) })
		noLeak(t, src, "is a symbolic link")
	})
	t.Run("blobs symlinked to a host directory", func(t *testing.T) {
		src := layoutOf(t, img)
		host := t.TempDir()
		if err := os.Rename(filepath.Join(src, "blobs"), filepath.Join(host, "blobs")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(host, "blobs"), filepath.Join(src, "blobs")); err != nil {
			t.Fatal(err)
		}
		noLeak(t, src, "is a symbolic link")
	})
	t.Run("index.json symlinked to a FIFO", func(t *testing.T) {
		src := layoutOf(t, img)
		replace(t, filepath.Join(src, "index.json"), func(p string) error { return os.Symlink(fifo, p) })
		noLeak(t, src, "index.json is a symbolic link")
	})
	t.Run("index.json a FIFO", func(t *testing.T) {
		src := layoutOf(t, img)
		replace(t, filepath.Join(src, "index.json"), func(p string) error { return syscall.Mkfifo(p, 0o600) })
		noLeak(t, src, "index.json is not a regular file")
	})
	t.Run("layer a FIFO", func(t *testing.T) {
		src := layoutOf(t, img)
		layers, _ := img.Layers()
		d, _ := layers[0].Digest()
		replace(t, blobPath(src, d), func(p string) error { return syscall.Mkfifo(p, 0o600) })
		noLeak(t, src, "is not a regular file")
	})
	t.Run("archive: index.json a symlink member", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "layout.tar")
		if err := os.WriteFile(p, tarBytes(t, file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`), symlink("index.json", secret)), 0o644); err != nil {
			t.Fatal(err)
		}
		noLeak(t, p, "index.json is a link in the archive")
	})
}

// TestLayoutArchive: an OCI layout packed as a tar is read in place.
func TestLayoutArchive(t *testing.T) {
	requireRoot(t)
	img := fixture(t)
	src := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, src, "v1", img)
	archive := filepath.Join(t.TempDir(), "layout.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	f.Close()
	dst := filepath.Join(t.TempDir(), "rootfs")
	cfg, digest, err := Import(context.Background(), archive, "v1", dst)
	if err != nil {
		t.Fatal(err)
	}
	if digest != digestOf(t, img) {
		t.Errorf("digest %s, want %s", digest, digestOf(t, img))
	}
	checkConfig(t, cfg)
	checkFixture(t, dst)
}
