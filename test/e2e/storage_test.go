package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/evalbox/evalbox/pkg/client"
)

// randomTar is a tar archive holding one file of n random bytes (which
// compress to nothing smaller).
func randomTar(t *testing.T, file string, n int) []byte {
	t.Helper()
	body := make([]byte, n)
	rand.Read(body)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: file, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(n)}); err != nil {
		t.Fatal(err)
	}
	tw.Write(body)
	tw.Close()
	return buf.Bytes()
}

// storageOf returns the team's storage usage and limit.
func storageOf(t *testing.T, c *client.Client, teamID string) client.TeamUsage {
	t.Helper()
	tm, err := c.GetTeam(ctxT(t, time.Minute), teamID)
	if err != nil {
		t.Fatal(err)
	}
	if tm.Usage == nil {
		t.Fatalf("team %s: no usage", teamID)
	}
	return *tm.Usage
}

// wantQuota checks that err is a 413 storage_quota_exceeded.
func wantQuota(t *testing.T, what string, err error) {
	t.Helper()
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 413 || apiErr.Code != client.CodeStorageQuotaExceeded ||
		!strings.Contains(apiErr.Message, "over its limit of 8.0 MiB") {
		t.Errorf("%s: %v, want 413 storage_quota_exceeded", what, err)
	}
}

// TestTeamStorageQuota gives a team 8 MiB of storage and checks that
// templates (built and imported), uploads and build contexts in flight and
// eval inputs count against it; that a request past it fails with 413
// storage_quota_exceeded before anything is stored, leaving nothing; that
// GET /v1/teams/{id} shows the usage; and that deleting frees it and an
// admin can raise it (CLI too).
func TestTeamStorageQuota(t *testing.T) {
	t.Parallel()
	c, team, key := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4, MaxStorageMB: 8})
	ctx := ctxT(t, 5*time.Minute)
	const limit = 8 << 20
	if u := storageOf(t, c, team.ID); u.StorageBytes != 0 || u.MaxStorageBytes != limit {
		t.Fatalf("a new team's usage: %+v", u)
	}
	noBuilds := func(what string) {
		t.Helper()
		if _, err := c.GetTemplate(ctx, "big"); !client.IsNotFound(err) {
			t.Errorf("%s: template big: %v", what, err)
		}
		if u := storageOf(t, c, team.ID); u.StorageBytes != 0 {
			t.Errorf("%s: usage %d, want 0", what, u.StorageBytes)
		}
	}

	// An upload whose length is over the limit: refused before it is read.
	big := randomTar(t, "layer.tar", 9<<20)
	_, err := c.ImportTemplate(ctx, client.ImportOptions{Name: "big"}, bytes.NewReader(big), int64(len(big)))
	wantQuota(t, "import with Content-Length", err)
	// Sent without a length: refused once it passes the limit.
	_, err = c.ImportTemplate(ctx, client.ImportOptions{Name: "big"}, io.MultiReader(bytes.NewReader(big)), -1)
	wantQuota(t, "chunked import", err)
	// A build context past the limit.
	_, err = c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "big", Spec: client.TemplateSpec{From: "base",
		Steps: []client.TemplateStep{{Copy: &client.CopyStep{Src: "data", Dst: "/data"}}}}}, bytes.NewReader(randomTar(t, "data/x", 9<<20)))
	wantQuota(t, "build context", err)
	// An eval whose input is past the limit.
	body := strings.Repeat("    x = 1\n", 1<<20) + "    return 1\n"
	_, err = c.CreateEval(ctx, client.CreateEvalRequest{Runtime: client.RuntimeNamespaces,
		Problems: []client.EvalProblem{{TaskID: "t/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}},
		Samples:  []client.EvalSample{{TaskID: "t/0", Completion: &body}}})
	wantQuota(t, "eval input", err)
	if runs, err := c.ListEvals(ctx); err != nil || len(runs) != 0 {
		t.Errorf("eval runs after the refusal: %v %v", runs, err)
	}
	noBuilds("after the refusals")

	// A build whose run step writes past the limit fails, saying so, and
	// leaves no template.
	b, log := buildAndWait(t, c, "big", client.TemplateSpec{From: "base", Network: client.NetworkNone,
		Steps: []client.TemplateStep{{Run: "head -c 9437184 /dev/urandom > /big"}}}, nil)
	if b.State != client.BuildStateFailed || b.FailedStep != 1 || !strings.Contains(b.Error, "storage quota exceeded") {
		t.Errorf("a build past the limit: %+v\n%s", b, log)
	}
	assertNoBuildLeftovers(t, b.ID)
	noBuilds("after the failed build")

	// Within the limit: an import counts its files, once per digest.
	img := testImage(t)
	archive := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("example.test/quota:1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	imp, err := c.ImportTemplate(ctx, client.ImportOptions{Name: "small"}, f, fi.Size())
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, c, "small")
	if end, err := c.FollowBuild(ctx, "small", imp.ID, nil); err != nil || end.State != client.BuildStateSucceeded {
		t.Fatalf("import within the limit: %+v %v", end, err)
	}
	small, err := c.GetTemplate(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	if small.StorageBytes <= 0 || small.StorageBytes > small.SizeBytes {
		t.Errorf("storage_bytes %d of a template of %d", small.StorageBytes, small.SizeBytes)
	}
	if u := storageOf(t, c, team.ID); u.StorageBytes != small.StorageBytes {
		t.Errorf("usage %d after the import, want %d", u.StorageBytes, small.StorageBytes)
	}
	// A build from base counts what it adds, not base's files.
	bb, log := buildAndWait(t, c, "built", client.TemplateSpec{From: "base", Network: client.NetworkNone,
		Steps: []client.TemplateStep{{Run: "head -c 100000 /dev/urandom > /added"}}}, nil)
	if bb.State != client.BuildStateSucceeded {
		t.Fatalf("small build: %+v\n%s", bb, log)
	}
	deleteTemplateAtEnd(t, c, "built")
	built, err := c.GetTemplate(ctx, "built")
	if err != nil {
		t.Fatal(err)
	}
	if built.StorageBytes < 100000 || built.StorageBytes > 1<<20 || built.SizeBytes < 50<<20 {
		t.Errorf("a build from base: storage_bytes %d, size_bytes %d", built.StorageBytes, built.SizeBytes)
	}
	if u := storageOf(t, c, team.ID); u.StorageBytes != small.StorageBytes+built.StorageBytes {
		t.Errorf("usage %d, want %d", u.StorageBytes, small.StorageBytes+built.StorageBytes)
	}
	// An eval's input counts until the run is deleted.
	one := "    return 1\n"
	run, err := c.CreateEval(ctx, client.CreateEvalRequest{Runtime: client.RuntimeNamespaces,
		Problems: []client.EvalProblem{{TaskID: "t/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}},
		Samples:  []client.EvalSample{{TaskID: "t/0", Completion: &one}}})
	if err != nil {
		t.Fatal(err)
	}
	withEval := storageOf(t, c, team.ID).StorageBytes
	if withEval <= small.StorageBytes+built.StorageBytes {
		t.Errorf("the eval's input does not count: %d", withEval)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		r, err := c.GetEval(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != client.EvalStateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the eval run did not end")
		}
	}
	if err := c.DeleteEval(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetEval(ctx, run.ID); !client.IsNotFound(err) {
		t.Errorf("deleted run: %v", err)
	}
	if u := storageOf(t, c, team.ID); u.StorageBytes != small.StorageBytes+built.StorageBytes {
		t.Errorf("usage %d after the eval's delete", u.StorageBytes)
	}
	// Deleting a template frees what it counted.
	if err := c.DeleteTemplate(ctx, "built"); err != nil {
		t.Fatal(err)
	}
	if u := storageOf(t, c, team.ID); u.StorageBytes != small.StorageBytes {
		t.Errorf("usage %d after the template's delete", u.StorageBytes)
	}

	// The admin raises the limit (CLI); the upload that was refused fits.
	adminCLI := func(args ...string) (string, string, int) { return cliAs(t, srv.adminKey, args...) }
	if stdout, stderr, code := adminCLI("teams", "update", team.ID, "--max-storage-mb", "64"); code != 0 {
		t.Fatalf("teams update: %d %s %s", code, stdout, stderr)
	}
	stdout, _, code := adminCLI("teams", "get", team.ID)
	if code != 0 || !strings.Contains(stdout, "STORAGE") || !strings.Contains(stdout, "of 64.0MiB") {
		t.Errorf("teams get:\n%s", stdout)
	}
	// (It is no image: a 400 once it is in, and nothing is counted.)
	status, answer := importRaw(t, key, "name=big", big)
	if status != http.StatusBadRequest || !strings.Contains(answer, "neither a docker-archive") {
		t.Errorf("after the raise: %d %s", status, answer)
	}
	if u := storageOf(t, c, team.ID); u.StorageBytes != small.StorageBytes || u.MaxStorageBytes != 64<<20 {
		t.Errorf("usage after the raise: %+v", u)
	}
	// The CLI says what went wrong in one line, exit 1.
	if _, err := srv.admin.UpdateTeam(ctx, team.ID, client.UpdateTeamRequest{Limits: client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4, MaxStorageMB: 1}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "big.tar"), big, 0o644)
	_, stderr, code := cliAs(t, key, "template", "import", "--name", "big", filepath.Join(dir, "big.tar"))
	if code != 1 || !strings.Contains(stderr, "storage_quota_exceeded") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("CLI import past the limit: %d %q", code, stderr)
	}
}
