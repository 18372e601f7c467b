package oci

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// bigLayer writes a layer of n files of about size bytes each (text-like,
// compressing about 3:1 as real images do) to a file in dir.
func bigLayer(b *testing.B, dir string, seed uint64, n, size int) v1.Layer {
	b.Helper()
	p := filepath.Join(dir, fmt.Sprintf("layer%d.tar", seed))
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(w)
	rnd := rand.New(rand.NewPCG(seed, 0))
	words := []string{"import ", "def ", "return ", "self", ".value", " = ", "(x, y)", "\n    ", "None", "# comment\n", "0x7f3a", "class ", ":\n"}
	body := make([]byte, 0, 2*size)
	for i := 0; i < n; i++ {
		if i%100 == 0 {
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("usr/lib/pkg%d/", i/100), Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
				b.Fatal(err)
			}
		}
		body = body[:0]
		for len(body) < size {
			body = append(body, words[rnd.IntN(len(words))]...)
			body = append(body, byte('a'+rnd.IntN(26)), byte('0'+rnd.IntN(10)))
		}
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("usr/lib/pkg%d/f%d.py", i/100, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: mtime}); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			b.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	l, err := tarball.LayerFromFile(p)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkImport200MB imports a two-layer image of 200 MB of files (5000
// files of 40 KB) from an OCI layout (gzip layers) and from a `docker save`
// archive (uncompressed layers, digest computed alongside).
func BenchmarkImport200MB(b *testing.B) {
	dir := b.TempDir()
	img := imageOf(b, "", bigLayer(b, dir, 1, 4000, 40<<10), bigLayer(b, dir, 2, 1000, 40<<10))
	lay := filepath.Join(dir, "layout")
	writeLayout(b, lay, "", img)
	save := filepath.Join(dir, "save.tar")
	writeDockerSave(b, save, "example.com/big:1", img)
	for _, src := range []string{lay, save} {
		b.Run(filepath.Base(src), func(b *testing.B) {
			b.SetBytes(200 << 20)
			for i := 0; b.Loop(); i++ {
				dst := filepath.Join(dir, fmt.Sprintf("rootfs%d", i))
				if _, _, err := Import(context.Background(), src, "", dst); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
	}
}
