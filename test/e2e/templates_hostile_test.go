package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

// TestTemplateSparseBombs uploads archives of a few KiB holding a sparse
// member that claims 2 GiB, as image archives and as build contexts:
// refused at once (400), nothing written (an OCI layout or a context used
// to be unpacked, writing the 2 GiB of zeros).
func TestTemplateSparseBombs(t *testing.T) {
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
	for name, bomb := range map[string][]byte{
		"pax": tarbomb.SparsePAX("data/bomb", 2<<30),
		"gnu": tarbomb.SparseGNU("data/bomb", 2<<30),
	} {
		status, body := postBuild(t, key, `{"name":"bomb","spec":{"from":"base","steps":[{"copy":{"src":"data","dst":"/data"}}]}}`, bomb)
		if status != 400 || !strings.Contains(body, "sparse file") {
			t.Errorf("context %s: %d %s", name, status, body)
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

// TestTemplateContextUnpackedInSlot: a queued build holds its context as
// the archive it was sent as; it is unpacked only once the build has its
// slots (contexts used to be unpacked at once, outside the slots, so that
// any number of queued builds held unpacked contexts).
func TestTemplateContextUnpackedInSlot(t *testing.T) {
	t.Parallel()
	s := startServerT(t, serverOptions{args: []string{"--max-builds", "1"}})
	ctx := ctxT(t, 3*time.Minute)
	c := s.admin
	first, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "slow", Spec: client.TemplateSpec{From: "base", Network: client.NetworkNone,
		Steps: []client.TemplateStep{{Run: "sleep 4; echo > /slow"}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	queued, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "queued", Spec: client.TemplateSpec{From: "base",
		Steps: []client.TemplateStep{{Copy: &client.CopyStep{Src: "data", Dst: "/data"}}}}},
		tarOf(t, map[string]string{"data/a.txt": "alpha\n", "data/b.txt": "beta\n"}))
	if err != nil {
		t.Fatal(err)
	}
	work, _ := filepath.Glob(filepath.Join(s.dataDir, "images", "tmp", queued.ID+"-context-*"))
	if len(work) != 1 {
		t.Fatalf("work dirs of the queued build: %v", work)
	}
	if b, err := c.GetBuild(ctx, "queued", queued.ID); err != nil || b.State != client.BuildStateQueued {
		t.Fatalf("the second build is not queued: %+v %v", b, err)
	}
	entries, _ := os.ReadDir(work[0])
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "context.tar" {
		t.Errorf("a queued build holds %v, want only its context.tar", names)
	}
	var log strings.Builder
	end, err := c.FollowBuild(ctx, "queued", queued.ID, &log)
	if err != nil || end.State != client.BuildStateSucceeded {
		t.Fatalf("queued build: %+v %v\n%s", end, err, log.String())
	}
	if end1, err := c.GetBuild(ctx, "slow", first.ID); err != nil || end1.State != client.BuildStateSucceeded ||
		end.StartedAt.Before(*end1.FinishedAt) {
		t.Errorf("builds overlapped or failed: %+v %v", end1, err)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "queued", Runtime: client.RuntimeNamespaces})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.DeleteSandbox(context.Background(), sb.ID)
		assertGone(t, s, sb.ID)
	}()
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "cat /data/a.txt /data/b.txt"}); err != nil || res.Stdout != "alpha\nbeta\n" {
		t.Errorf("copied context: %+v %v", res, err)
	}
	// A context that fails to unpack only in its slot fails the build (a
	// hard link to a symlink pointing out of the context, which the scan
	// of the headers does not resolve), and leaves nothing.
	bad := tarMembers(t, nil,
		&tar.Header{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"},
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "s"})
	b, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "bad", Spec: client.TemplateSpec{From: "base",
		Steps: []client.TemplateStep{{Copy: &client.CopyStep{Src: "d", Dst: "/d"}}}}}, bytes.NewReader(bad))
	if err != nil {
		t.Fatal(err)
	}
	end, err = c.FollowBuild(ctx, "bad", b.ID, nil)
	if err != nil || end.State != client.BuildStateFailed || !strings.Contains(end.Error, "outside the build context") {
		t.Errorf("bad context: %+v %v", end, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left, _ := filepath.Glob(filepath.Join(s.dataDir, "images", "tmp", b.ID+"*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left: %v", left)
		}
	}
}

// rawTeam creates a team on the shared server with the JSON of the first
// API version (no storage limit) and returns a client with a key of it.
func rawTeam(t *testing.T, prefix string) *client.Client {
	t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, teamSeq.Add(1))
	status, body := rawDo(t, "POST", srv.url+"/v1/teams", srv.adminKey, `{"name":"`+name+`","limits":{"max_sandboxes":4,"max_concurrent_execs":4}}`)
	var team client.Team
	if status != 201 || json.Unmarshal([]byte(body), &team) != nil {
		t.Fatalf("create team: %d %s", status, body)
	}
	key, err := srv.admin.CreateKey(ctxT(t, time.Minute), client.CreateKeyRequest{Name: "k", TeamID: team.ID})
	if err != nil {
		t.Fatal(err)
	}
	return client.New(srv.url, key.Key)
}

// TestTemplateLayerCachePerTeam: two teams building the same spec get
// their own layers and digests (no "CACHED" of the other's build: it used
// to tell a team what another built, and hand it the other's files), a
// team's rebuild is cached, and a step run without network does not reuse
// the layer of the same step run with it.
func TestTemplateLayerCachePerTeam(t *testing.T) {
	t.Parallel()
	a, b := rawTeam(t, "cache-a"), rawTeam(t, "cache-b")
	marker := fmt.Sprintf("/when-%d", time.Now().UnixNano())
	spec := client.TemplateSpec{From: "base", Network: client.NetworkNone, Steps: []client.TemplateStep{{Run: "date +%s%N > " + marker}}}
	ba, log := buildAndWait(t, a, "same", spec, nil)
	deleteTemplateAtEnd(t, a, "same")
	if ba.State != client.BuildStateSucceeded || ba.BuiltSteps != 1 {
		t.Fatalf("team a: %+v\n%s", ba, log)
	}
	bb, log := buildAndWait(t, b, "same", spec, nil)
	deleteTemplateAtEnd(t, b, "same")
	if bb.State != client.BuildStateSucceeded || bb.CachedSteps != 0 || bb.BuiltSteps != 1 || strings.Contains(log, "CACHED") ||
		bb.Digest == ba.Digest {
		t.Errorf("team b got team a's layer: %+v\n%s", bb, log)
	}
	again, log := buildAndWait(t, a, "same", spec, nil)
	if again.CachedSteps != 1 || again.Digest != ba.Digest || !strings.Contains(log, "#1 CACHED") {
		t.Errorf("team a's rebuild: %+v\n%s", again, log)
	}
	// The same step with outbound network: a layer of its own.
	spec.Network = client.NetworkOutbound
	withNet, log := buildAndWait(t, a, "same", spec, nil)
	if withNet.State != client.BuildStateSucceeded || withNet.CachedSteps != 0 || withNet.Digest == ba.Digest {
		t.Errorf("with network: %+v\n%s", withNet, log)
	}
}
