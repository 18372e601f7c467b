package e2e

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/evalbox/evalbox/pkg/client"
)

// registrySecret is what the fake internal service answers; it must show
// nowhere.
const registrySecret = "SECRET-metadata-token-e2e-91c4"

// fakeInternal stands for an internal service (a metadata endpoint): it
// counts its requests and answers each with the secret.
func fakeInternal(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var hits atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		fmt.Fprint(w, registrySecret)
	}))
	t.Cleanup(s.Close)
	return s, &hits
}

func hostPort(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

// importImage starts an import of a registry reference and returns how it
// ended (nil with the status and body when it was refused at once).
func importImage(t *testing.T, c *client.Client, tmpl, image string) (*client.TemplateBuild, error) {
	t.Helper()
	b, err := c.ImportTemplate(ctxT(t, time.Minute), client.ImportOptions{Name: tmpl, Image: image}, nil, 0)
	if err != nil {
		return nil, err
	}
	return c.FollowBuild(ctxT(t, 2*time.Minute), tmpl, b.ID, nil)
}

// TestTemplateImportRegistryGuard: imports from a registry cannot make
// the server fetch internal addresses: loopback is refused by default (a
// literal address at once, a name once resolved), an operator's
// --registry-allow lets a registry on loopback be used, a redirect or a
// token realm of an allowed registry to another loopback service is
// refused, and nothing an internal service or a registry answers shows in
// the build's error or the server's log.
func TestTemplateImportRegistryGuard(t *testing.T) {
	t.Parallel()
	internal, hits := fakeInternal(t)
	_, internalPort, _ := strings.Cut(hostPort(internal), ":")
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg := httptest.NewServer(inner)
	t.Cleanup(reg.Close)
	ref, err := name.ParseReference(hostPort(reg) + "/evalbox/showenv:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, testImage(t)); err != nil {
		t.Fatal(err)
	}

	// The shared server allows no registry on loopback.
	c := srv.admin
	_, err = importImage(t, c, "ssrf", ref.String())
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "127.0.0.1 is a loopback address") {
		t.Errorf("a literal loopback registry: %v", err)
	}
	end, err := importImage(t, c, "ssrf", "localhost:"+internalPort+"/latest/meta-data:1")
	if err != nil || end.State != client.BuildStateFailed || !strings.Contains(end.Error, "is a loopback address") ||
		strings.Contains(end.Error, "SECRET") {
		t.Errorf("a name that resolves to loopback: %+v %v", end, err)
	}
	if end != nil {
		assertNoBuildLeftovers(t, end.ID)
	}

	// A server whose operator allows the registry (and a redirecting one,
	// one with a token realm, one answering errors).
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			http.Redirect(w, r, "http://localhost:"+internalPort+"/latest/meta-data/", http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(redirect.Close)
	realm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://localhost:`+internalPort+`/token",service="x"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(realm.Close)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"errors":[{"code":"DENIED","message":%q}]}`, registrySecret)
	}))
	t.Cleanup(failing.Close)
	s := startServerT(t, serverOptions{args: []string{"--registry-allow",
		strings.Join([]string{hostPort(reg), hostPort(redirect), hostPort(realm), hostPort(failing)}, ",")}})
	end, err = importImage(t, s.admin, "allowed", ref.String())
	if err != nil || end.State != client.BuildStateSucceeded {
		t.Fatalf("an allowed registry: %+v %v", end, err)
	}
	if tm, err := s.admin.GetTemplate(ctxT(t, time.Minute), "allowed"); err != nil || tm.User != "app" {
		t.Errorf("imported: %+v %v", tm, err)
	}
	for what, image := range map[string]string{
		"redirect to loopback":    strings.Replace(ref.String(), hostPort(reg), hostPort(redirect), 1),
		"token realm on loopback": strings.Replace(ref.String(), hostPort(reg), hostPort(realm), 1),
	} {
		end, err := importImage(t, s.admin, "refused", image)
		if err != nil || end.State != client.BuildStateFailed || !strings.Contains(end.Error, "is a loopback address") {
			t.Errorf("%s: %+v %v", what, end, err)
		}
	}
	end, err = importImage(t, s.admin, "refused", strings.Replace(ref.String(), hostPort(reg), hostPort(failing), 1))
	if err != nil || end.State != client.BuildStateFailed || !strings.Contains(end.Error, "the registry answered HTTP 403 Forbidden (DENIED)") ||
		strings.Contains(end.Error, "SECRET") {
		t.Errorf("a registry's error: %+v %v", end, err)
	}
	// Another registry than the allowed ones: refused at once.
	_, err = importImage(t, s.admin, "refused", "docker.io/library/alpine:3.20")
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "not one of the registries") {
		t.Errorf("a registry not allowed: %v", err)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the internal service got %d requests", n)
	}
	for _, p := range []string{srv.logPath, s.logPath} {
		if b, _ := os.ReadFile(p); strings.Contains(string(b), "SECRET") {
			t.Errorf("%s shows what was answered", p)
		}
	}
}
