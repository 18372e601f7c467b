package nodeagent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/template"
)

const token = "node-token"

var digest = "sha256:" + strings.Repeat("ab", 32)

// fixture is a template's export stream, made by the code the control
// plane uses.
func fixture(t *testing.T) []byte {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hostname"), bytes.Repeat([]byte("x"), 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := template.Export(context.Background(), &buf, &template.Template{Name: "f", Digest: digest, RootFS: root}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func registry(t *testing.T) *template.Registry {
	t.Helper()
	r, err := template.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.UseStore(filepath.Join(t.TempDir(), "images")); err != nil {
		t.Fatal(err)
	}
	return r
}

// controlPlane serves body (after the token check) and counts requests.
func controlPlane(t *testing.T, body func(w http.ResponseWriter)) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token || r.URL.Path != nodeapi.TemplatePath(digest) {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		n.Add(1)
		body(w)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func nothingLeft(t *testing.T, r *template.Registry) {
	t.Helper()
	for _, d := range []string{"templates", "tmp"} {
		if entries, _ := os.ReadDir(filepath.Join(r.StoreDir(), d)); len(entries) > 0 {
			t.Errorf("%s holds %d entries after a refused fetch", d, len(entries))
		}
	}
}

func TestFetchOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the unpack keeps owners)")
	}
	stream := fixture(t)
	release := make(chan struct{})
	srv, n := controlPlane(t, func(w http.ResponseWriter) {
		<-release // every create has asked by then
		w.Header().Set(nodeapi.HeaderContentDigest, sum(stream))
		_, _ = w.Write(stream)
	})
	r := registry(t)
	f := newFetcher(context.Background(), srv.URL, token, nil, r, 0, slog.Default(), nil)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f.fetch(context.Background(), digest, sum(stream)) }()
	}
	time.Sleep(200 * time.Millisecond)
	close(release)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n.Load() != 1 || !r.HasStored(digest) {
		t.Errorf("%d fetches, stored %v; want 1, true", n.Load(), r.HasStored(digest))
	}
}

// TestFetchFromAHostileControlPlane: whatever a control plane sends that is
// not the template asked for is refused and leaves nothing.
func TestFetchFromAHostileControlPlane(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the unpack keeps owners)")
	}
	stream := fixture(t)
	want := sum(stream)
	tampered := bytes.Clone(stream)
	tampered[len(tampered)-2048] ^= 1 // a byte of the file
	var traversal bytes.Buffer
	tw := tar.NewWriter(&traversal)
	_ = tw.WriteHeader(&tar.Header{Name: "../../escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	cases := []struct {
		name string
		body func(w http.ResponseWriter)
		max  int64
	}{
		{"tampered", func(w http.ResponseWriter) { _, _ = w.Write(tampered) }, 0},
		{"traversal", func(w http.ResponseWriter) { _, _ = w.Write(traversal.Bytes()) }, 0},
		{"oversize", func(w http.ResponseWriter) { _, _ = w.Write(stream) }, int64(len(stream)) / 4},
		{"endless", func(w http.ResponseWriter) {
			_, _ = w.Write(stream[:1024])
			for range 1 << 10 {
				if _, err := w.Write(make([]byte, 64<<10)); err != nil {
					return
				}
			}
		}, 1 << 20},
		{"wrong header", func(w http.ResponseWriter) {
			w.Header().Set(nodeapi.HeaderContentDigest, sum(tampered))
			_, _ = w.Write(tampered)
		}, 0},
		{"error status", func(w http.ResponseWriter) { http.Error(w, "nope", http.StatusInternalServerError) }, 0},
		{"cut short", func(w http.ResponseWriter) { _, _ = w.Write(stream[:len(stream)/2]) }, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, _ := controlPlane(t, c.body)
			r := registry(t)
			f := newFetcher(context.Background(), srv.URL, token, nil, r, c.max, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			err := f.fetch(context.Background(), digest, want)
			if err == nil {
				t.Fatal("accepted")
			}
			if c.name == "tampered" && !errors.Is(err, template.ErrContentMismatch) {
				t.Errorf("tampered: %v", err)
			}
			nothingLeft(t, r)
			if _, err := os.Lstat(filepath.Join(filepath.Dir(r.StoreDir()), "escaped")); err == nil {
				t.Error("the stream wrote outside the store")
			}
		})
	}
	// A wrong token never gets a stream.
	srv, n := controlPlane(t, func(w http.ResponseWriter) { _, _ = w.Write(stream) })
	f := newFetcher(context.Background(), srv.URL, "wrong", nil, registry(t), 0, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err := f.fetch(context.Background(), digest, want); err == nil || n.Load() != 0 {
		t.Errorf("wrong token: %v, %d streams", err, n.Load())
	}
}
