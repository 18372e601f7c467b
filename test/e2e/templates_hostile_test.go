package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/template/tarbomb"
	"github.com/evalbox/evalbox/pkg/client"
)

// importRaw posts body to the import endpoint and returns the status and
// the answer.
func importRaw(t *testing.T, key, query string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", srv.url+"/v1/templates/import?"+query, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// tarMembers is a tar archive of headers (regular members get their
// bodies from bodies, by name).
func tarMembers(t *testing.T, bodies map[string]string, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(bodies[h.Name]))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, bodies[h.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestTemplateImportReadsInPlace uploads OCI layouts whose index.json is a
// symlink to the server's admin key: the import fails, saying so, and
// nothing of the key is in the error (the upload used to be unpacked, and
// the symlink followed as root: the JSON error showed the key's first
// byte).
func TestTemplateImportReadsInPlace(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2})
	adminKey := filepath.Join(srv.dataDir, "admin.key")
	secret, err := os.ReadFile(adminKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{adminKey, "../../../../admin.key"} {
		layout := tarMembers(t, map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`},
			&tar.Header{Name: "oci-layout", Typeflag: tar.TypeReg},
			&tar.Header{Name: "index.json", Typeflag: tar.TypeSymlink, Linkname: target})
		b, err := c.ImportTemplate(ctxT(t, time.Minute), client.ImportOptions{Name: "leak"}, bytes.NewReader(layout), int64(len(layout)))
		if err != nil {
			t.Fatal(err)
		}
		end, err := c.FollowBuild(ctxT(t, time.Minute), "leak", b.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if end.State != client.BuildStateFailed || !strings.Contains(end.Error, "index.json is a link") {
			t.Errorf("symlink to %s: %+v", target, end)
		}
		if strings.Contains(end.Error, "invalid character") || strings.Contains(end.Error, string(secret[:3])) {
			t.Errorf("the error shows the admin key: %q", end.Error)
		}
		assertNoBuildLeftovers(t, b.ID)
	}
	if _, err := c.GetTemplate(ctxT(t, time.Minute), "leak"); !client.IsNotFound(err) {
		t.Errorf("template leak: %v", err)
	}
}

// TestTemplateImportSparseBomb uploads archives of a few KiB holding a
// sparse member that claims 2 GiB: refused at once (400), nothing written
// (an OCI layout used to be unpacked, writing the 2 GiB of zeros).
func TestTemplateImportSparseBomb(t *testing.T) {
	t.Parallel()
	_, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 2})
	layout := tarMembers(t, map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": `{"schemaVersion":2,"manifests":[]}`},
		&tar.Header{Name: "oci-layout", Typeflag: tar.TypeReg}, &tar.Header{Name: "index.json", Typeflag: tar.TypeReg})
	for name, bomb := range map[string][]byte{
		"pax": tarbomb.Members(layout, tarbomb.SparsePAX("blobs/sha256/bomb", 2<<30)),
		"gnu": tarbomb.Members(layout, tarbomb.SparseGNU("blobs/sha256/bomb", 2<<30)),
	} {
		if len(bomb) > 16<<10 {
			t.Fatalf("%s: the bomb is %d bytes", name, len(bomb))
		}
		status, body := importRaw(t, key, "name=bomb", bomb)
		if status != 400 || !strings.Contains(body, "sparse file") {
			t.Errorf("%s: %d %s", name, status, body)
		}
	}
	// Nothing big was written (other tests' work may be there, small).
	filepath.WalkDir(filepath.Join(srv.dataDir, "images", "tmp"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil && fi.Size() > 256<<20 {
				t.Errorf("%s: %d bytes", p, fi.Size())
			}
		}
		return nil
	})
}
