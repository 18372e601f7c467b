package e2b

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/compat/e2b/envdpb/filesystempb"
	"github.com/evalbox/evalbox/pkg/client"
)

func ptr[T any](v T) *T { return &v }

func TestTranslateNetwork(t *testing.T) {
	for _, c := range []struct {
		name     string
		internet *bool
		n        *networkConfig
		want     client.NetworkSpec
		wantErr  string
	}{
		{name: "default: internet, as on E2B", want: client.Network(client.NetworkOutbound)},
		{name: "internet on", internet: ptr(true), want: client.Network(client.NetworkOutbound)},
		{name: "internet off", internet: ptr(false), want: client.Network(client.NetworkNone)},
		{name: "allow list", n: &networkConfig{DenyOut: []string{allTraffic}, AllowOut: []string{"pypi.org", "10.0.0.0/8"}},
			want: client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"pypi.org", "10.0.0.0/8"}, Deny: []string{}}},
		{name: "deny all", n: &networkConfig{DenyOut: []string{allTraffic}}, want: client.Network(client.NetworkNone)},
		{name: "deny some", n: &networkConfig{DenyOut: []string{"1.2.3.4/32"}}, wantErr: client.CodeNotImplemented},
		{name: "public traffic", n: &networkConfig{AllowPublicTraffic: ptr(true)}, wantErr: client.CodeNotImplemented},
		{name: "not public: the default", n: &networkConfig{AllowPublicTraffic: ptr(false)}, want: client.Network(client.NetworkOutbound)},
		{name: "mask host", n: &networkConfig{MaskRequestHost: "x"}, wantErr: client.CodeNotImplemented},
		{name: "off and allow", internet: ptr(false), n: &networkConfig{DenyOut: []string{allTraffic}, AllowOut: []string{"a.b"}}, wantErr: client.CodeBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := translateNetwork(c.internet, c.n)
			if c.wantErr != "" {
				if code := codeOf(err); code != c.wantErr {
					t.Fatalf("err %v (code %q), want code %q", err, code, c.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func codeOf(err error) string { return apierr.Code(err) }

func TestMetadataFilter(t *testing.T) {
	for v, want := range map[string]map[string]string{
		"":                nil,
		"k1=v1&k2=v2":     {"k1": "v1", "k2": "v2"},
		"k%2520y=v%25261": {"k y": "v&1"}, // the SDK's quoting, once decoded by the query
		"case=lifecycle":  {"case": "lifecycle"},
	} {
		got, err := metadataFilter(v)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("metadataFilter(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	if _, err := metadataFilter("k=%zz"); err == nil {
		t.Error("bad percent-encoding accepted")
	}
}

func TestEndEvent(t *testing.T) {
	ok := endEvent(client.ExecResult{Status: client.StatusExited})
	if !ok.Exited || ok.ExitCode != 0 || ok.Status != "exit status 0" || ok.Error != nil {
		t.Errorf("exit 0: %+v", ok)
	}
	three := endEvent(client.ExecResult{Status: client.StatusExited, ExitCode: 3})
	if three.ExitCode != 3 || three.GetError() != "exit status 3" {
		t.Errorf("exit 3: %+v", three)
	}
	killed := endEvent(client.ExecResult{Status: client.StatusKilled, Signal: 9, ExitCode: -1})
	if killed.Exited || killed.ExitCode != -1 || killed.Status != "signal: killed" || killed.GetError() != "signal: killed" {
		t.Errorf("killed: %+v", killed)
	}
}

func TestEntryInfo(t *testing.T) {
	mt := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := entryInfo(client.FileInfo{Name: "a", Path: "/w/a", Type: "file", Size: 5, Mode: "0644", ModTime: mt})
	if f.Type != filesystempb.FileType_FILE_TYPE_FILE || f.Mode != 0o644 || f.Permissions != "-rw-r--r--" || !f.ModifiedTime.AsTime().Equal(mt) || f.Size != 5 {
		t.Errorf("file: %+v", f)
	}
	d := entryInfo(client.FileInfo{Path: "/w/d", Type: "dir", Mode: "0755"})
	if d.Type != filesystempb.FileType_FILE_TYPE_DIRECTORY || d.Permissions != "drwxr-xr-x" || d.Name != "d" {
		t.Errorf("dir: %+v", d)
	}
	l := entryInfo(client.FileInfo{Path: "/w/l", Type: "symlink", Mode: "0777", Target: "/etc"})
	if !l.IsSymlink || l.GetSymlinkTarget() != "/etc" {
		t.Errorf("symlink: %+v", l)
	}
}

// TestTokens: a token opens one sandbox for one purpose, under one key.
func TestTokens(t *testing.T) {
	k1, k2 := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	a := derive(k1, purposeEnvd, "sb-a")
	for _, other := range []string{
		derive(k1, purposeEnvd, "sb-b"),
		derive(k1, purposeTraffic, "sb-a", ""),
		derive(k2, purposeEnvd, "sb-a"),
		derive(k1, purposeEnvd, "sb-", "a"), // parts are delimited
	} {
		if equal(a, other) {
			t.Fatalf("%s opens more than it should", a)
		}
	}
	if a != derive(k1, purposeEnvd, "sb-a") {
		t.Fatal("not deterministic")
	}
}

// TestRoutesRegister: the E2B routes register on one mux beside each
// other (net/http panics on patterns that conflict).
func TestRoutesRegister(t *testing.T) {
	mux := http.NewServeMux()
	New(Config{}).Register(mux)
	for _, path := range []string{"/templates/aliases/x", "/templates/x/tags", "/templates/x/files/h"} {
		r := httptest.NewRequest("GET", path, nil)
		if _, pattern := mux.Handler(r); pattern == "" {
			t.Errorf("GET %s: no route", path)
		}
	}
}
