package oci

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// mtime is the modification time of every fixture entry unless set.
var mtime = time.Unix(1700000000, 0)

// ent is one tar entry of a test layer.
type ent struct {
	name   string
	typ    byte // tar.TypeReg when 0
	body   string
	link   string
	mode   int64 // 0644 (files) / 0755 (dirs) when 0
	uid    int
	gid    int
	major  int64
	minor  int64
	xattrs map[string]string
	mtime  time.Time
}

func file(name, body string) ent    { return ent{name: name, body: body} }
func dir(name string) ent           { return ent{name: name, typ: tar.TypeDir} }
func symlink(name, to string) ent   { return ent{name: name, typ: tar.TypeSymlink, link: to} }
func hardlink(name, to string) ent  { return ent{name: name, typ: tar.TypeLink, link: to} }
func whiteout(dir, name string) ent { return file(filepath.Join(dir, ".wh."+name), "") }

// tarBytes writes entries as a tar stream, without any check of their names.
func tarBytes(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, Devmajor: e.major, Devminor: e.minor,
			ModTime: e.mtime, Format: tar.FormatPAX,
		}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.ModTime.IsZero() {
			h.ModTime = mtime
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerOf is a gzip-compressed layer of the entries. (tarball.LayerFromReader
// is deprecated and leaves a temp file behind; LayerFromOpener does not.)
func layerOf(t testing.TB, entries ...ent) v1.Layer {
	t.Helper()
	b := tarBytes(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var testConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "GREETING=hello world"},
	WorkingDir: "/srv/app",
	User:       "1000:1001",
	Entrypoint: []string{"/bin/tool", "--serve"},
	Cmd:        []string{"--port", "8080"},
}

// imageOf stacks layers into an image for arch (the host's when "") with
// testConfig.
func imageOf(t testing.TB, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, testConfig)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	if arch == "" {
		cf.Architecture = runtime.GOARCH
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digestOf(t testing.TB, img v1.Image) string {
	t.Helper()
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// writeArchive writes img as a docker-archive tarball (gzip layers, as
// go-containerregistry writes them).
func writeArchive(t testing.TB, path, tag string, img v1.Image) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		t.Fatal(err)
	}
}

// writeDockerSave writes img the way classic `docker save` does: one
// directory per layer holding an uncompressed layer.tar, the config as
// <id>.json, and manifest.json last.
func writeDockerSave(t testing.TB, path, tag string, img v1.Image) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	put := func(name string, size int64, r io.Reader) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: mtime}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, r); err != nil {
			t.Fatal(err)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		n := filepath.Join("layer"+string(rune('a'+i)), "layer.tar")
		put(n, int64(len(b)), bytes.NewReader(b))
		names = append(names, n)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfgName := "config.json"
	put(cfgName, int64(len(raw)), bytes.NewReader(raw))
	m, err := json.Marshal(tarball.Manifest{{Config: cfgName, RepoTags: []string{tag}, Layers: names}})
	if err != nil {
		t.Fatal(err)
	}
	put("manifest.json", int64(len(m)), bytes.NewReader(m))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeLayout writes img into a new OCI layout at path, annotated with ref
// when not "".
func writeLayout(t testing.TB, path, ref string, img v1.Image) layout.Path {
	t.Helper()
	p, err := layout.Write(path, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{annotationRefName: ref}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		t.Fatal(err)
	}
	return p
}

// assertNothingLeft checks that dir is empty: no destination, no staging.
func assertNothingLeft(t testing.TB, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind in %s: %s", dir, e.Name())
	}
}

func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }
