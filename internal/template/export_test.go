package template

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// exportFixture makes a small template outside any registry: files, a
// directory, a symlink, a hard link, a FIFO.
func exportFixture(t *testing.T) *Template {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"etc", "usr/bin", "work"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("fixture\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/tool"), bytes.Repeat([]byte("x"), 100_000), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "usr/bin/tool"), filepath.Join(root, "usr/bin/tool2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	return &Template{Name: "fixture", Digest: "sha256:" + strings.Repeat("ab", 32), RootFS: root,
		Defaults: Defaults{Workdir: "/work", User: "root"}, Source: SourceBuild}
}

func exportBytes(t *testing.T, tpl *Template) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Export(context.Background(), &buf, tpl); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func storeRegistry(t *testing.T) *Registry {
	t.Helper()
	r, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.UseStore(filepath.Join(t.TempDir(), "images")); err != nil {
		t.Fatal(err)
	}
	return r
}

// leftInWork fails the test when a fetch left anything in the store's
// work area or stored a template.
func assertNothingLeft(t *testing.T, r *Registry, d string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(r.StoreDir(), tmpDir))
	if len(entries) > 0 {
		t.Errorf("the work area holds %d entries after a refused fetch", len(entries))
	}
	if r.HasStored(d) {
		t.Errorf("a refused fetch stored %s", d)
	}
}

func TestExportFetchRoundTrip(t *testing.T) {
	needRoot(t)
	tpl := exportFixture(t)
	b := exportBytes(t, tpl)
	if b2 := exportBytes(t, tpl); !bytes.Equal(b, b2) {
		t.Fatal("two exports of one template differ")
	}
	r := storeRegistry(t)
	got, err := r.AddFetched(context.Background(), tpl.Digest, sha(b), bytes.NewReader(b), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != tpl.Digest || got.Defaults.Workdir != "/work" {
		t.Errorf("fetched template = %+v", got)
	}
	if by, err := r.ByDigest(tpl.Digest); err != nil || by.RootFS != got.RootFS {
		t.Errorf("ByDigest after the fetch: %v, %v", by, err)
	}
	if target, err := os.Readlink(filepath.Join(got.RootFS, "bin")); err != nil || target != "usr/bin" {
		t.Errorf("symlink: %q, %v", target, err)
	}
	a, _ := os.Stat(filepath.Join(got.RootFS, "usr/bin/tool"))
	c, _ := os.Stat(filepath.Join(got.RootFS, "usr/bin/tool2"))
	if a == nil || c == nil || !os.SameFile(a, c) || a.Size() != 100_000 {
		t.Error("the hard link did not come through as one")
	}
	// The copy exports to the same stream: content-addressed end to end.
	if b3 := exportBytes(t, got); !bytes.Equal(b, b3) {
		t.Error("the fetched copy exports to other bytes")
	}
	if ds, err := r.Digests(); err != nil || len(ds) != 1 || ds[0] != tpl.Digest {
		t.Errorf("Digests = %v, %v", ds, err)
	}
	assertNothingLeft(t, r, "sha256:"+strings.Repeat("00", 32))
}

func TestContentDigestCached(t *testing.T) {
	needRoot(t)
	tpl := exportFixture(t)
	r := storeRegistry(t)
	b := exportBytes(t, tpl)
	if _, err := r.AddFetched(context.Background(), tpl.Digest, sha(b), bytes.NewReader(b), 0); err != nil {
		t.Fatal(err)
	}
	cd, err := r.ContentDigest(context.Background(), tpl.Digest)
	if err != nil || cd != sha(b) {
		t.Fatalf("ContentDigest = %s, %v; want %s", cd, err, sha(b))
	}
	stored, _ := r.ByDigest(tpl.Digest)
	rec, err := os.ReadFile(filepath.Join(filepath.Dir(stored.RootFS), contentDigestFile))
	if err != nil || !strings.Contains(string(rec), cd) {
		t.Fatalf("content digest not cached: %s, %v", rec, err)
	}
	// The cache is what answers next (a forged record shows it).
	forged, _ := json.Marshal(contentDigestRecord{Format: exportFormat, Digest: tpl.Digest, ContentDigest: "sha256:" + strings.Repeat("cd", 32)})
	_ = os.WriteFile(filepath.Join(filepath.Dir(stored.RootFS), contentDigestFile), forged, 0o644)
	if cd2, _ := r.ContentDigest(context.Background(), tpl.Digest); cd2 != "sha256:"+strings.Repeat("cd", 32) {
		t.Errorf("ContentDigest did not use its cache: %s", cd2)
	}
}

// streamOf builds a stream from members, each a header and a body.
func streamOf(t *testing.T, members ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i < len(members); i += 2 {
		hdr := members[i].(*tar.Header)
		body := members[i+1].(string)
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(body))
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o755
		}
		hdr.ModTime = time.Unix(0, 0)
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if body != "" {
			_, _ = tw.Write([]byte(body))
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

func TestFetchRefusesHostileStreams(t *testing.T) {
	needRoot(t)
	tpl := exportFixture(t)
	good := exportBytes(t, tpl)
	meta, _ := json.Marshal(tpl)
	tampered := bytes.Clone(good)
	i := bytes.Index(tampered, []byte("fixture\n"))
	tampered[i] = 'F'
	other := *tpl
	other.Digest = "sha256:" + strings.Repeat("ef", 32)
	otherMeta, _ := json.Marshal(&other)
	outside := filepath.Join(t.TempDir(), "planted")
	cases := []struct {
		name   string
		stream []byte
		cd     string // "" = the stream's own hash (a control plane that lies consistently)
		max    int64
		want   string
	}{
		{"tampered", tampered, sha(good), 0, "does not match"},
		{"traversal", streamOf(t, &tar.Header{Name: "template.json", Typeflag: tar.TypeReg}, string(meta),
			&tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir}, "",
			&tar.Header{Name: "rootfs/../../" + filepath.Base(outside), Typeflag: tar.TypeReg}, "x"), "", 0, ".."},
		{"absolute", streamOf(t, &tar.Header{Name: outside, Typeflag: tar.TypeReg}, "x"), "", 0, "absolute"},
		{"through a symlink", streamOf(t, &tar.Header{Name: "template.json", Typeflag: tar.TypeReg}, string(meta),
			&tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir}, "",
			&tar.Header{Name: "rootfs/out", Typeflag: tar.TypeSymlink, Linkname: filepath.Dir(outside)}, "",
			&tar.Header{Name: "rootfs/out/" + filepath.Base(outside), Typeflag: tar.TypeReg}, "x"), "", 0, "rootfs/out"},
		{"oversize", good, sha(good), int64(len(good)) / 2, "larger than the maximum"},
		{"another template", streamOf(t, &tar.Header{Name: "template.json", Typeflag: tar.TypeReg}, string(otherMeta),
			&tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir}, ""), "", 0, "not sha256:abab"},
		{"extra member", streamOf(t, &tar.Header{Name: "template.json", Typeflag: tar.TypeReg}, string(meta),
			&tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir}, "",
			&tar.Header{Name: "evil", Typeflag: tar.TypeReg}, "x"), "", 0, "unexpected member"},
		{"no rootfs", streamOf(t, &tar.Header{Name: "template.json", Typeflag: tar.TypeReg}, string(meta)), "", 0, "no rootfs"},
		{"device", streamOf(t, &tar.Header{Name: "template.json", Typeflag: tar.TypeReg}, string(meta),
			&tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir}, "",
			&tar.Header{Name: "rootfs/sda", Typeflag: tar.TypeBlock, Devmajor: 8}, ""), "", 0, ""},
		{"truncated", good[:len(good)/2], sha(good), 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := storeRegistry(t)
			cd := c.cd
			if cd == "" {
				cd = sha(c.stream)
			}
			_, err := r.AddFetched(context.Background(), tpl.Digest, cd, bytes.NewReader(c.stream), c.max)
			if c.name == "device" {
				// Dropped, as in a layer: the template is stored without it.
				if err != nil {
					t.Fatal(err)
				}
				got, _ := r.ByDigest(tpl.Digest)
				if _, err := os.Lstat(filepath.Join(got.RootFS, "sda")); err == nil {
					t.Error("a block device was kept")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("AddFetched = %v, want an error with %q", err, c.want)
			}
			if _, err := os.Lstat(outside); err == nil {
				t.Fatal("the stream wrote outside the store")
			}
			assertNothingLeft(t, r, tpl.Digest)
		})
	}
}

func TestFetchStopsReadingPastTheBound(t *testing.T) {
	needRoot(t)
	r := storeRegistry(t)
	// An endless stream: the fetch stops at the bound, not at the end.
	endless := io.MultiReader(bytes.NewReader(streamOf(t, &tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir}, "")[:512]), zeros{})
	_, err := r.AddFetched(context.Background(), "sha256:"+strings.Repeat("ab", 32), "sha256:"+strings.Repeat("ab", 32), endless, 1<<20)
	if err == nil {
		t.Fatal("an endless stream was accepted")
	}
	assertNothingLeft(t, r, "sha256:"+strings.Repeat("ab", 32))
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestFetchConcurrentSameDigest(t *testing.T) {
	needRoot(t)
	tpl := exportFixture(t)
	b := exportBytes(t, tpl)
	r := storeRegistry(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.AddFetched(context.Background(), tpl.Digest, sha(b), bytes.NewReader(b), 0)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Error(err)
		}
	}
	assertNothingLeft(t, r, "sha256:"+strings.Repeat("00", 32))
	if !r.HasStored(tpl.Digest) {
		t.Error("not stored")
	}
}
