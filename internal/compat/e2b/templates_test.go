package e2b

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/catalog"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeTemplates is the catalog seam: a few templates, no builds.
type fakeTemplates struct{ list []client.Template }

func (f *fakeTemplates) List(context.Context, string) (client.TemplateList, error) {
	return client.TemplateList{Templates: f.list}, nil
}

func (f *fakeTemplates) Get(_ context.Context, _, name string) (client.Template, error) {
	for _, t := range f.list {
		if t.Name == name {
			return t, nil
		}
	}
	return client.Template{}, apierr.Errorf(client.CodeNotFound, "template %q not found", name)
}

func (f *fakeTemplates) Delete(context.Context, string, string) error { return nil }
func (f *fakeTemplates) Build(context.Context, string, string, client.TemplateSpec, io.Reader, catalog.BuildOptions) (client.TemplateBuild, error) {
	return client.TemplateBuild{}, errors.New("not here")
}
func (f *fakeTemplates) Tags(context.Context, string, string) ([]client.TemplateTag, error) {
	return nil, errors.New("not here")
}
func (f *fakeTemplates) Tag(context.Context, string, string, string, []string) (string, error) {
	return "", errors.New("not here")
}
func (f *fakeTemplates) Untag(context.Context, string, string, []string) error {
	return errors.New("not here")
}
func (f *fakeTemplates) GetBuild(context.Context, string, string, string) (client.TemplateBuild, error) {
	return client.TemplateBuild{}, errors.New("not here")
}
func (f *fakeTemplates) OpenLog(context.Context, string, string, string) (io.ReadCloser, error) {
	return nil, errors.New("not here")
}
func (f *fakeTemplates) MaxContextBytes() int64 { return 1 << 20 }

func tarOf(t *testing.T, entries map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range entries {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(data))
	}
	tw.Close()
	return buf.Bytes()
}

// TestTranslateBuild: E2B's steps become evalbox's, each traced back to
// its E2B step; a RUN as another user switches and switches back; COPY
// sources come from their upload's directory, owned by the current user
// unless the step says otherwise; ready commands are retried.
func TestTranslateBuild(t *testing.T) {
	cat := &fakeTemplates{list: []client.Template{
		{Name: "python", Source: "builtin", User: "root", Workdir: "/work"},
		{Name: "py312", Source: "import", From: "docker.io/library/python:3.12@sha256:abc", User: "root", Workdir: "/"},
	}}
	h := New(Config{Templates: cat, FilesDir: t.TempDir()})
	hash := "0123456789abcdef0123456789abcdef"
	if err := h.files.put("team", hash, bytes.NewReader(tarOf(t, map[string]string{"src/a.py": "a"})), -1); err != nil {
		t.Fatal(err)
	}
	e := &e2bBuild{team: "team", name: "x", cpu: 2, memoryMB: 512}
	spec, stepMap, hashes, err := h.translateBuild(context.Background(), "team", e, buildStart{
		FromImage: "python:3.12",
		Steps: []buildStep{
			{Type: "ENV", Args: []string{"A", "1", "B", "2"}},
			{Type: "RUN", Args: []string{"apt-get update"}},
			{Type: "USER", Args: []string{"app"}},
			{Type: "RUN", Args: []string{"make", "root"}},
			{Type: "WORKDIR", Args: []string{"srv"}},
			{Type: "COPY", Args: []string{"src/*.py", "lib/", "", "0644"}, FilesHash: hash},
			{Type: "COPY", Args: []string{"src", "/opt/", "other:staff", ""}, FilesHash: hash},
		},
		StartCmd: "serve", ReadyCmd: "check",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []client.TemplateStep{
		{Env: map[string]string{"A": "1", "B": "2"}},
		{Run: "apt-get update"},
		{User: "app"},
		{User: "root"}, {Run: "make"}, {User: "app"},
		{Workdir: "/srv"},
		{Copy: &client.CopyStep{Src: hash + "/src", Dst: "lib/", Owner: "app", Mode: "0644"}},
		{Copy: &client.CopyStep{Src: hash + "/src", Dst: "/opt/", Owner: "other:staff"}},
	}
	if !reflect.DeepEqual(spec.Steps, want) {
		t.Errorf("steps:\n got %+v\nwant %+v", spec.Steps, want)
	}
	if want := []int{1, 2, 3, 4, 4, 4, 5, 6, 7}; !reflect.DeepEqual(stepMap, want) {
		t.Errorf("step map %v, want %v", stepMap, want)
	}
	if spec.From != "py312" || spec.CPU != 2 || spec.MemoryMB != 512 || spec.StartCmd != "serve" || spec.ReadyCmd != readyLoop("check") {
		t.Errorf("spec %+v", spec)
	}
	if !reflect.DeepEqual(hashes, []string{hash}) {
		t.Errorf("hashes %v", hashes)
	}

	// A build that names E2B's user "user" gets it, as every E2B template
	// has it.
	spec, stepMap, _, err = h.translateBuild(context.Background(), "team", e, buildStart{FromTemplate: "python",
		Steps: []buildStep{{Type: "USER", Args: []string{"user"}}, {Type: "WORKDIR", Args: []string{"/home/user"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []client.TemplateStep{{Run: addE2BUser}, {User: "user"}, {Workdir: "/home/user"}}; !reflect.DeepEqual(spec.Steps, want) || !reflect.DeepEqual(stepMap, []int{0, 1, 2}) {
		t.Errorf("E2B's user: %+v %v", spec.Steps, stepMap)
	}

	for name, req := range map[string]buildStart{
		"not imported":     {FromImage: "ubuntu:24.04"},
		"both":             {FromImage: "python", FromTemplate: "python"},
		"neither":          {},
		"unknown step":     {FromTemplate: "python", Steps: []buildStep{{Type: "ADD", Args: []string{"a", "b"}}}},
		"odd env":          {FromTemplate: "python", Steps: []buildStep{{Type: "ENV", Args: []string{"A"}}}},
		"files not sent":   {FromTemplate: "python", Steps: []buildStep{{Type: "COPY", Args: []string{"a", "b"}, FilesHash: "ff" + hash}}},
		"no files hash":    {FromTemplate: "python", Steps: []buildStep{{Type: "COPY", Args: []string{"a", "b"}}}},
		"a registry":       {FromImage: "python", FromImageRegistry: map[string]any{"type": "registry"}},
		"another's upload": {FromTemplate: "python", Steps: []buildStep{{Type: "COPY", Args: []string{"a", "b"}, FilesHash: hash}}},
	} {
		team := "team"
		if name == "another's upload" {
			team = "other"
		}
		if _, _, _, err := h.translateBuild(context.Background(), team, e, req); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestGlobBase(t *testing.T) {
	for src, want := range map[string]string{"app.py": "app.py", "src/*.py": "src", "**/*.txt": ".", ".": ".", "a/b/c": "a/b/c", "a/[xy]/c": "a"} {
		if got := globBase(src); got != want {
			t.Errorf("globBase(%q) = %q, want %q", src, got, want)
		}
	}
}

// TestUploads: a non-tar, a name that leaves the archive and an upload over
// the limit are refused and leave nothing; a team's uploads are its own;
// the build context puts each under its hash.
func TestUploads(t *testing.T) {
	dir := t.TempDir()
	c := &fileCache{dir: dir, max: func() int64 { return 4096 }}
	hash := "00112233445566778899aabbccddeeff"
	for name, body := range map[string][]byte{
		"not a tar": []byte("hello"),
		"escape":    tarOf(t, map[string]string{"../x": "x"}),
		"absolute":  tarOf(t, map[string]string{"/etc/x": "x"}),
		"link to the root": func() []byte {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "."})
			tw.Close()
			return buf.Bytes()
		}(),
		"over limit": tarOf(t, map[string]string{"big": string(make([]byte, 8192))}),
	} {
		if err := c.put("team", hash, bytes.NewReader(body), -1); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "team", "*")); len(left) != 0 {
		t.Errorf("refused uploads left %v", left)
	}
	if err := c.put("team", hash, bytes.NewReader(tarOf(t, map[string]string{"a/b.txt": "b", "./c": "c"})), -1); err != nil {
		t.Fatal(err)
	}
	if !c.present("team", hash) || c.present("other", hash) {
		t.Error("an upload is its team's alone")
	}
	var out bytes.Buffer
	if err := c.writeContext(&out, "team", []string{hash}); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	if want := []string{hash + "/", hash + "/a/b.txt", hash + "/c"}; !sameSet(names, want) {
		t.Errorf("context %v, want %v", names, want)
	}
	// The first upload of a hash stays: a second PUT cannot replace it.
	if err := c.put("team", hash, bytes.NewReader(tarOf(t, map[string]string{"evil": "x"})), -1); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := c.writeContext(&out, "team", []string{hash}); err != nil || bytes.Contains(out.Bytes(), []byte("evil")) {
		t.Errorf("a second upload replaced the first (%v)", err)
	}
	// Expired uploads are gone.
	old := time.Now().Add(-2 * pendingTTL)
	os.Chtimes(c.path("team", hash), old, old)
	if c.present("team", hash) {
		t.Error("an expired upload is present")
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		m[x]--
	}
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}

func TestReadLine(t *testing.T) {
	long := strings.Repeat("x", maxLogLine+100)
	br := bufio.NewReaderSize(strings.NewReader("one\r\n"+long+"\nlast"), maxLogLine)
	for _, want := range []struct {
		line string
		took int64
		eof  bool
	}{{"one", 5, false}, {long[:maxLogLine], int64(len(long) + 1), false}, {"last", 4, true}} {
		line, took, err := readLine(br)
		if line != want.line || took != want.took || (err == io.EOF) != want.eof {
			t.Errorf("readLine = %d bytes, took %d, %v; want %d bytes, took %d", len(line), took, err, len(want.line), want.took)
		}
	}
}

type fixedSecret struct{}

func (fixedSecret) ServerSecret(context.Context, string) ([]byte, error) {
	return []byte("0123456789abcdef0123456789abcdef"), nil
}

// TestUploadLink: the upload URL is built on the request's scheme and
// Host, or on the public URL the server was given (behind a TLS proxy);
// its signature opens that team's upload of that hash, until it expires.
func TestUploadLink(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	for public, want := range map[string]string{"": "http://10.0.0.5:8700/e2b/uploads/team_a/" + hash,
		"https://evalbox.example.com": "https://evalbox.example.com/e2b/uploads/team_a/" + hash} {
		h := New(Config{Templates: &fakeTemplates{}, FilesDir: t.TempDir(), Secrets: fixedSecret{}, PublicURL: public})
		r := httptest.NewRequest("GET", "/templates/x/files/"+hash, nil)
		r.Host = "10.0.0.5:8700"
		r.SetPathValue("hash", hash)
		w := httptest.NewRecorder()
		h.fileUploadLink(w, r, auth.Principal{TeamID: "team_a"})
		var link fileUpload
		if err := json.Unmarshal(w.Body.Bytes(), &link); err != nil || w.Code != http.StatusCreated || link.Present {
			t.Fatalf("public %q: %d %s", public, w.Code, w.Body)
		}
		u, err := url.Parse(link.URL)
		if err != nil || u.Scheme+"://"+u.Host+u.Path != want {
			t.Errorf("public %q: upload URL %s, want %s…", public, link.URL, want)
		}
		put := func(path, query string) int {
			r := httptest.NewRequest("PUT", path+"?"+query, bytes.NewReader(tarOf(t, map[string]string{"a": "a"})))
			parts := strings.Split(strings.TrimPrefix(path, uploadPath), "/")
			r.SetPathValue("team", parts[0])
			r.SetPathValue("hash", parts[1])
			w := httptest.NewRecorder()
			h.uploadFile(w, r)
			return w.Code
		}
		q := u.Query()
		if code := put(uploadPath+"team_b/"+hash, u.RawQuery); code != http.StatusUnauthorized {
			t.Errorf("another team's path: %d", code)
		}
		q.Set("exp", strconv.FormatInt(time.Now().Add(2*uploadTTL).Unix(), 10))
		if code := put(u.Path, q.Encode()); code != http.StatusUnauthorized {
			t.Errorf("a later expiry, same signature: %d", code)
		}
		if code := put(u.Path, u.RawQuery); code != http.StatusOK {
			t.Errorf("the URL as given: %d", code)
		}
	}
}
