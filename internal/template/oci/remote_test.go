package oci

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// secret is what the fake internal services answer: it must never show.
const secret = "SECRET-internal-answer-7f3a"

// counting serves h and counts the requests.
func counting(h http.Handler) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h.ServeHTTP(w, r)
	}))
	return srv, &n
}

// internalService stands for what must not be reached: it answers every
// request with the secret.
func internalService() (*httptest.Server, *atomic.Int64) {
	return counting(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		fmt.Fprint(w, secret)
	}))
}

func hostOf(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "http://") }

// pushFixture puts a small image in the registry at host.
func pushFixture(t *testing.T, host string) string {
	t.Helper()
	ref, err := name.ParseReference(host + "/evalbox/small:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, imageOf(t, "", layerOf(t, file("f", "x")))); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// pullFails pulls ref with im and checks the error wraps want, mentions
// msg, shows no secret, and leaves nothing (want nil: any error).
func pullFails(t *testing.T, im *Importer, ref string, want error, msg string) {
	t.Helper()
	dstParent := t.TempDir()
	_, _, err := im.ImportRemote(context.Background(), ref, filepath.Join(dstParent, "rootfs"), nil)
	if err == nil || (want != nil && !errors.Is(err, want)) || !strings.Contains(err.Error(), msg) {
		t.Errorf("err = %v; want %v mentioning %q", err, want, msg)
	} else {
		t.Logf("%v", err)
	}
	if err != nil && strings.Contains(err.Error(), "SECRET") {
		t.Errorf("the error shows what was answered: %v", err)
	}
	assertNothingLeft(t, dstParent)
}

// TestRemoteDefaultRefusesInternal: by default an image reference on a
// loopback address (literal, or a name resolving to it) is refused before
// any connection, and nothing the service would answer shows (it used to
// be fetched, its answer in the error).
func TestRemoteDefaultRefusesInternal(t *testing.T) {
	svc, hits := internalService()
	defer svc.Close()
	_, port, _ := strings.Cut(hostOf(svc), ":")
	for _, ref := range []string{hostOf(svc) + "/x:1", "localhost:" + port + "/x:1", "[::1]:" + port + "/x:1"} {
		dstParent := t.TempDir()
		_, _, err := ImportRemote(context.Background(), ref, filepath.Join(dstParent, "rootfs"))
		if err == nil || !strings.Contains(err.Error(), "loopback address") {
			t.Errorf("%s: %v, want a refusal", ref, err)
		}
		if err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%s: the error shows the answer: %v", ref, err)
		}
		assertNothingLeft(t, dstParent)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the internal service got %d requests", n)
	}
}

func TestRemoteAllowList(t *testing.T) {
	requireRoot(t)
	reg, hits := counting(registry.New(registry.Logger(discardLog())))
	defer reg.Close()
	ref := pushFixture(t, hostOf(reg))
	hits.Store(0)

	// Refused by default (loopback) and when the list names others.
	pullFails(t, &Importer{}, ref, ErrRegistryRefused, "127.0.0.1 is a loopback address")
	pullFails(t, &Importer{AllowRegistries: AllowList{"registry.example"}}, ref, ErrRegistryRefused,
		"is not one of the registries this server pulls from")
	pullFails(t, &Importer{AllowRegistries: AllowList{"registry.example"}}, "docker.io/library/alpine:3", ErrRegistryRefused,
		"index.docker.io is not one of the registries")
	if n := hits.Load(); n != 0 {
		t.Errorf("refused pulls made %d requests", n)
	}
	// Allowed by host:port, and by host alone (any port).
	_, port, _ := strings.Cut(hostOf(reg), ":")
	for _, allow := range []string{hostOf(reg), "127.0.0.1", "LOCALHOST"} {
		list, err := ParseAllowList([]string{allow})
		if err != nil {
			t.Fatal(err)
		}
		r := ref
		if allow == "LOCALHOST" {
			r = "localhost:" + port + "/evalbox/small:1"
		}
		if _, _, err := (&Importer{AllowRegistries: list}).ImportRemote(context.Background(), r, filepath.Join(t.TempDir(), "rootfs"), nil); err != nil {
			t.Errorf("allowed by %q: %v", allow, err)
		}
	}
	for _, bad := range []string{"http://x", "x/y", "x:", "a@b"} {
		if _, err := ParseAllowList([]string{bad}); err == nil {
			t.Errorf("ParseAllowList(%q) took it", bad)
		}
	}
}

// TestRemoteRealmAndRedirect: an allowed registry whose token realm, or
// whose redirect, points at a loopback service: the pull is refused and
// that service never gets a request.
func TestRemoteRealmAndRedirect(t *testing.T) {
	requireRoot(t)
	svc, hits := internalService()
	defer svc.Close()
	_, svcPort, _ := strings.Cut(hostOf(svc), ":")
	inner := registry.New(registry.Logger(discardLog()))

	realm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://localhost:`+svcPort+`/token",service="reg"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	defer realm.Close()
	pullFails(t, &Importer{AllowRegistries: AllowList{hostOf(realm)}}, hostOf(realm)+"/evalbox/small:1", ErrRegistryRefused,
		"is a loopback address")

	reg := httptest.NewServer(inner)
	defer reg.Close()
	ref := pushFixture(t, hostOf(reg))
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") || strings.Contains(r.URL.Path, "/blobs/") {
			http.Redirect(w, r, "http://localhost:"+svcPort+"/latest/meta-data/", http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	defer redirect.Close()
	pullFails(t, &Importer{AllowRegistries: AllowList{hostOf(redirect)}}, strings.Replace(ref, hostOf(reg), hostOf(redirect), 1),
		ErrRegistryRefused, "is a loopback address")
	if n := hits.Load(); n != 0 {
		t.Errorf("the internal service got %d requests", n)
	}
}

// TestRemoteErrorsShowNoBody: what an (allowed) registry answers in its
// errors is not in the import's error: its status and codes are.
func TestRemoteErrorsShowNoBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		ctype  string
		body   string
		msg    string
	}{
		{"plain 500", 500, "text/plain", secret, "the registry answered HTTP 500 Internal Server Error"},
		{"registry error", 403, "application/json", `{"errors":[{"code":"DENIED","message":"` + secret + `","detail":"` + secret + `"}]}`,
			"the registry answered HTTP 403 Forbidden (DENIED)"},
		{"odd error code", 403, "application/json", `{"errors":[{"code":"` + secret + `","message":"x"}]}`, "HTTP 403 Forbidden"},
		{"not a manifest", 200, "application/vnd.oci.image.manifest.v1+json", secret, "not a valid image manifest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v2/" {
					return
				}
				w.Header().Set("Content-Type", tc.ctype)
				if tc.status == 200 {
					w.Header().Set("Docker-Content-Digest", "sha256:"+strings.Repeat("0", 64))
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			pullFails(t, &Importer{AllowRegistries: AllowList{hostOf(srv)}}, hostOf(srv)+"/x:1", nil, tc.msg)
		})
	}
}

func TestCheckAddr(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "127.1.2.3", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.100.100.200",
		"0.0.0.0", "::1", "::", "fd00:ec2::254", "fe80::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe",
		"2002:7f00:1::", "224.0.0.1", "255.255.255.255"} {
		if err := checkAddr(netip.MustParseAddr(a)); !errors.Is(err, ErrRegistryRefused) {
			t.Errorf("%s: %v", a, err)
		}
	}
	for _, a := range []string{"8.8.8.8", "1.1.1.1", "142.250.74.46", "2606:4700:4700::1111", "2a00:1450:4001:82b::200e"} {
		if err := checkAddr(netip.MustParseAddr(a)); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
}

// TestRemoteAnonymousByDefault: a pull sends none of the host's registry
// credentials (a team must not pull what the operator may), unless the
// operator turns HostCredentials on.
func TestRemoteAnonymousByDefault(t *testing.T) {
	requireRoot(t)
	inner := registry.New(registry.Logger(discardLog()))
	var sawAuth atomic.Int64
	var locked atomic.Bool // after the fixture's push
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			sawAuth.Add(1)
			inner.ServeHTTP(w, r)
			return
		}
		if !locked.Load() {
			inner.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="evalbox-test"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer reg.Close()
	ref := pushFixture(t, hostOf(reg))
	locked.Store(true)
	dockerDir := t.TempDir()
	cfg := fmt.Sprintf(`{"auths": {%q: {"auth": "b3BlcmF0b3I6aG9zdC1zZWNyZXQ="}}}`, hostOf(reg)) // operator:host-secret
	if err := os.WriteFile(filepath.Join(dockerDir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dockerDir)
	allow, err := ParseAllowList([]string{hostOf(reg)})
	if err != nil {
		t.Fatal(err)
	}
	pullFails(t, &Importer{AllowRegistries: allow}, ref, nil, "401")
	if n := sawAuth.Load(); n != 0 {
		t.Fatalf("an anonymous pull sent the host's credentials %d times", n)
	}
	if _, _, err := (&Importer{AllowRegistries: allow, HostCredentials: true}).ImportRemote(context.Background(), ref, filepath.Join(t.TempDir(), "rootfs"), nil); err != nil {
		t.Fatalf("with the host's credentials: %v", err)
	}
	if sawAuth.Load() == 0 {
		t.Fatal("HostCredentials sent no credentials")
	}
}
