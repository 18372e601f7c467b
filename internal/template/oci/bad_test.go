package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// importFails imports src into a fresh directory and checks the error wraps
// want, mentions msg, and leaves nothing behind.
func importFails(t *testing.T, src string, want error, msg string) {
	t.Helper()
	dstParent := t.TempDir()
	_, _, err := Import(context.Background(), src, "", filepath.Join(dstParent, "rootfs"))
	if !errors.Is(err, want) || !strings.Contains(err.Error(), msg) {
		t.Errorf("err = %v; want %v mentioning %q", err, want, msg)
	} else {
		t.Logf("%v", err)
	}
	assertNothingLeft(t, dstParent)
}

// layoutOf writes img as an OCI layout in a new directory.
func layoutOf(t *testing.T, img v1.Image) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, src, "", img)
	return src
}

// blobPath is where a layout keeps the blob h.
func blobPath(layoutDir string, h v1.Hash) string {
	return filepath.Join(layoutDir, "blobs", h.Algorithm, h.Hex)
}

func TestRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []ent
		msg     string
	}{
		{"dotdot", []ent{file("../evil", "x")}, `unsafe path: "../evil" has a ".." component`},
		{"nested dotdot", []ent{dir("a"), file("a/../../evil", "x")}, `".." component`},
		{"absolute", []ent{file("/evil", "x")}, "absolute path"},
		{"hardlink out", []ent{hardlink("h", "../evil")}, `".." component`},
		{"hardlink absolute", []ent{hardlink("h", "/etc/passwd")}, "absolute path"},
		{"whiteout out", []ent{file(".wh...", "")}, "whiteout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The staging directory sits next to the destination: "../evil"
			// would land in dstParent, which importFails checks is empty.
			src := filepath.Join(t.TempDir(), "img.tar")
			writeArchive(t, src, "example.com/evil:1", imageOf(t, "", layerOf(t, tc.entries...)))
			importFails(t, src, ErrInvalidImage, tc.msg)
		})
	}
}

func TestSymlinkTricks(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir() // stands for anything on the host outside dst
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("host data"), 0o644); err != nil {
		t.Fatal(err)
	}
	untouched := func(t *testing.T) {
		t.Helper()
		ents, _ := os.ReadDir(outside)
		var st unix.Stat_t
		unix.Stat(victim, &st)
		b, _ := os.ReadFile(victim)
		if len(ents) != 1 || string(b) != "host data" || st.Nlink != 1 {
			t.Errorf("outside changed: entries %v, victim %q nlink %d", ents, b, st.Nlink)
		}
	}
	importOK := func(t *testing.T, layers ...v1.Layer) string {
		t.Helper()
		src := filepath.Join(t.TempDir(), "img.tar")
		writeArchive(t, src, "example.com/trick:1", imageOf(t, "", layers...))
		dst := filepath.Join(t.TempDir(), "rootfs")
		if _, _, err := Import(context.Background(), src, "", dst); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	importBad := func(t *testing.T, msg string, layers ...v1.Layer) {
		t.Helper()
		src := filepath.Join(t.TempDir(), "img.tar")
		writeArchive(t, src, "example.com/trick:1", imageOf(t, "", layers...))
		importFails(t, src, ErrInvalidImage, msg)
	}
	rel := strings.Repeat("../", 12) + strings.TrimPrefix(outside, "/")

	t.Run("file over symlink", func(t *testing.T) {
		// The file replaces the symlink; nothing is written through it.
		dst := importOK(t, layerOf(t, symlink("f", victim)), layerOf(t, file("f", "image data")))
		if b, err := os.ReadFile(filepath.Join(dst, "f")); err != nil || string(b) != "image data" {
			t.Errorf("f = %q, %v", b, err)
		}
		var st unix.Stat_t
		unix.Lstat(filepath.Join(dst, "f"), &st)
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			t.Errorf("f mode %o", st.Mode)
		}
		untouched(t)
	})
	t.Run("same layer file over symlink", func(t *testing.T) {
		importOK(t, layerOf(t, symlink("f", victim), file("f", "image data")))
		untouched(t)
	})
	for _, target := range []string{outside, rel} {
		t.Run("through symlinked dir "+target[:3], func(t *testing.T) {
			// The symlink resolves inside dst, as in a chroot: when the
			// directory it names exists in the image the file lands there.
			in := strings.TrimPrefix(outside, "/")
			dst := importOK(t, layerOf(t, dir(in), symlink("d", target)), layerOf(t, file("d/victim", "image data")))
			if b, err := os.ReadFile(filepath.Join(dst, in, "victim")); err != nil || string(b) != "image data" {
				t.Errorf("in-root victim = %q, %v", b, err)
			}
			untouched(t)
			// When it does not, the write is refused.
			importBad(t, "no such file", layerOf(t, symlink("d", target)), layerOf(t, file("d/victim", "image data")))
			untouched(t)
		})
	}
	t.Run("hardlink through symlink", func(t *testing.T) {
		importBad(t, "hardlink target", layerOf(t, symlink("h", outside), hardlink("stolen", "h/victim")))
		untouched(t)
	})
	t.Run("whiteout through symlink", func(t *testing.T) {
		importOK(t, layerOf(t, symlink("h", outside)), layerOf(t, whiteout("h", "victim")))
		untouched(t)
	})
	t.Run("opaque through symlink", func(t *testing.T) {
		importOK(t, layerOf(t, symlink("h", outside)), layerOf(t, file("h/.wh..wh..opq", "")))
		untouched(t)
	})
	t.Run("chmod through symlink", func(t *testing.T) {
		// A directory entry over a symlink replaces the symlink.
		dst := importOK(t, layerOf(t, symlink("h", outside)), layerOf(t, ent{name: "h", typ: tar.TypeDir, mode: 0o777}))
		var st unix.Stat_t
		unix.Lstat(filepath.Join(dst, "h"), &st)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			t.Errorf("h mode %o", st.Mode)
		}
		if fi, _ := os.Stat(outside); fi.Mode().Perm() == 0o777 {
			t.Error("outside chmodded")
		}
		untouched(t)
	})
}

func TestCorruptInputs(t *testing.T) {
	dir := t.TempDir()
	img := imageOf(t, "", layerOf(t, file("a", strings.Repeat("data ", 20000)), file("b", "x")))
	archive := filepath.Join(dir, "img.tar")
	writeArchive(t, archive, "example.com/img:1", img)
	archiveBytes, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	layers, _ := img.Layers()
	layerDigest, _ := layers[0].Digest()

	t.Run("garbage", func(t *testing.T) {
		importFails(t, write("garbage", bytes.Repeat([]byte("not an image\n"), 100)), ErrInvalidImage, "neither a tarball nor an OCI layout")
	})
	t.Run("empty file", func(t *testing.T) {
		importFails(t, write("empty", nil), ErrInvalidImage, "neither a tarball nor an OCI layout")
	})
	t.Run("truncated", func(t *testing.T) {
		importFails(t, write("half.tar", archiveBytes[:len(archiveBytes)/2]), ErrInvalidImage, "truncated or corrupt")
	})
	t.Run("truncated in the manifest", func(t *testing.T) {
		cut := bytes.LastIndex(archiveBytes, []byte(`[{"Config"`)) + 10
		importFails(t, write("short.tar", archiveBytes[:cut]), ErrInvalidImage, "truncated or corrupt")
	})
	t.Run("gzipped tarball", func(t *testing.T) {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(archiveBytes)
		zw.Close()
		importFails(t, write("img.tar.gz", buf.Bytes()), ErrInvalidImage, "gzip-compressed")
	})
	t.Run("tar without manifest", func(t *testing.T) {
		importFails(t, write("plain.tar", tarBytes(t, file("hello", "x"))), ErrInvalidImage, "not a docker-archive")
	})
	t.Run("missing source", func(t *testing.T) {
		importFails(t, filepath.Join(dir, "nope"), fs.ErrNotExist, "no such file")
	})
	t.Run("not a layout", func(t *testing.T) {
		importFails(t, t.TempDir(), ErrInvalidImage, "not an OCI image layout")
	})
	t.Run("missing manifest", func(t *testing.T) {
		src := layoutOf(t, img)
		if err := os.Remove(blobPath(src, mustDigest(t, img))); err != nil {
			t.Fatal(err)
		}
		importFails(t, src, ErrInvalidImage, "is missing from the layout")
	})
	t.Run("missing layer", func(t *testing.T) {
		src := layoutOf(t, img)
		if err := os.Remove(blobPath(src, layerDigest)); err != nil {
			t.Fatal(err)
		}
		importFails(t, src, ErrInvalidImage, "no such file")
	})
	t.Run("truncated layer", func(t *testing.T) {
		src := layoutOf(t, img)
		p := blobPath(src, layerDigest)
		fi, _ := os.Stat(p)
		if err := os.Truncate(p, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
		importFails(t, src, ErrInvalidImage, "unexpected EOF")
	})
	t.Run("bad gzip", func(t *testing.T) {
		src := layoutOf(t, img)
		p := blobPath(src, layerDigest)
		b, _ := os.ReadFile(p)
		for i := len(b) / 3; i < len(b)/3+64; i++ {
			b[i] ^= 0xff
		}
		os.WriteFile(p, b, 0o644)
		importFails(t, src, ErrInvalidImage, "reading")
	})
	t.Run("layer not matching its diff id", func(t *testing.T) {
		// A well-formed layer, but not the one the config describes.
		src := layoutOf(t, img)
		other := layerOf(t, file("a", "something else"))
		rc, _ := other.Compressed()
		b, _ := io.ReadAll(rc)
		os.WriteFile(blobPath(src, layerDigest), b, 0o644)
		importFails(t, src, ErrInvalidImage, "the config says")
	})
}

func mustDigest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestUnsafeEntryInDockerSave checks a failing import of an archive of
// uncompressed layers, whose digest (a gzip pass) runs alongside: it is
// stopped and nothing is left.
func TestUnsafeEntryInDockerSave(t *testing.T) {
	src := filepath.Join(t.TempDir(), "img.tar")
	big := strings.Repeat("0123456789abcdef", 1<<16)
	writeDockerSave(t, src, "example.com/x:1", imageOf(t, "",
		layerOf(t, file("big1", big), file("big2", big)),
		layerOf(t, file("../evil", "x"))))
	importFails(t, src, ErrInvalidImage, "unsafe path")
}
