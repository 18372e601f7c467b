package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNode(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("  s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var got NodeConfig
	t.Cleanup(func() { NodeFunc = nil })
	NodeFunc = func(ctx context.Context, cfg NodeConfig) error { got = cfg; return nil }
	runCLI(t, "", "node", "--data-dir", "/tmp/n1", "--templates-dir", "/tmp/t", "--listen", "127.0.0.1:7170",
		"--health-listen", "127.0.0.1:7171", "--node-id", "Node-1", "--advertise", "10.0.0.5:7170", "--token-file", tokenFile,
		"--kubeconfig", "/tmp/kc", "--namespace", "evalbox-test", "--lease-duration", "5", "--control-plane", "http://api:8700",
		"--runtimes", "namespaces", "--host-pids", "9000", "--memory-overcommit", "3", "--insecure").ok(t)
	want := NodeConfig{
		NodeFlags: NodeFlags{DataDir: "/tmp/n1", TemplatesDir: "/tmp/t", Runtimes: []string{"namespaces"}, HostPids: 9000,
			MemoryOvercommit: 3, Logger: got.Logger},
		Listen: "127.0.0.1:7170", HealthListen: "127.0.0.1:7171", NodeID: "node-1", Advertise: "10.0.0.5:7170",
		Token: "s3cret-token", Insecure: true, Kubeconfig: "/tmp/kc", Namespace: "evalbox-test", LeaseDuration: 5 * time.Second,
		ControlPlane: "http://api:8700",
	}
	if gj, wj := must(json.Marshal(got)), must(json.Marshal(want)); string(gj) != string(wj) || got.Token != want.Token {
		t.Errorf("config\n%s\nwant\n%s", gj, wj)
	}

	runCLI(t, "", "node", "--token-file", tokenFile, "--control-plane", "https://evalbox-api.evalbox.svc:8443", "--control-plane-ca", "/ca.pem").ok(t)
	if got.ControlPlane != "https://evalbox-api.evalbox.svc:8443" || got.ControlPlaneCA != "/ca.pem" {
		t.Errorf("https control plane: %+v", got)
	}

	// Defaults.
	runCLI(t, "", "node", "--token-file", tokenFile).ok(t)
	host, _ := os.Hostname()
	if got.Listen != ":7070" || got.HealthListen != ":7071" || got.Namespace != "evalbox" || got.LeaseDuration != 15*time.Second ||
		got.DataDir != DefaultNodeDataDir || got.NodeID != strings.ToLower(host) || got.Kubeconfig != "" || got.Insecure {
		t.Errorf("defaults: %+v", got)
	}

	empty := filepath.Join(t.TempDir(), "empty")
	_ = os.WriteFile(empty, []byte(" \n"), 0o600)
	for _, a := range [][]string{
		{}, // no token file
		{"--token-file", "/nonexistent/token"},
		{"--token-file", empty},
		{"--token-file", tokenFile, "--node-id", "no_underscores"},
		{"--token-file", tokenFile, "--listen", "7070"},
		{"--token-file", tokenFile, "--health-listen", "nohost"},
		{"--token-file", tokenFile, "--advertise", ":7070"},
		{"--token-file", tokenFile, "--tls-cert", "/c.pem"},
		{"--token-file", tokenFile, "--tls-client-ca", "/ca.pem"},
		{"--token-file", tokenFile, "--tls-cert", "/c.pem", "--tls-key", "/k.pem", "--insecure"},
		{"--token-file", tokenFile, "--lease-duration", "1.5"},
		{"--token-file", tokenFile, "--lease-duration", "0"},
		{"--token-file", tokenFile, "--namespace", "Bad_NS"},
		{"--token-file", tokenFile, "--control-plane", "ftp://x"},
		{"--token-file", tokenFile, "--control-plane", "http://user:pw@x"},
		{"--token-file", tokenFile, "--control-plane", "http://api.example:8080"}, // the token in the clear
		{"--token-file", tokenFile, "--control-plane", "http://127.0.0.1:8080", "--control-plane-ca", "/ca.pem"},
		{"--token-file", tokenFile, "--control-plane-ca", "/ca.pem"},
		{"--token-file", tokenFile, "--runtimes", "docker"},
		{"--token-file", tokenFile, "--memory-overcommit", "0.5"},
		{"--token-file", tokenFile, "--log-level", "loud"},
		{"--token-file", tokenFile, "--no-such-flag"},
		{"--token-file", tokenFile, "extra-arg"},
	} {
		r := runCLI(t, "", append([]string{"node"}, a...)...)
		if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || strings.Contains(r.stderr, "s3cret") {
			t.Errorf("node %v: exit %d %q; want exit 2 and one line", a, r.code, r.stderr)
		}
	}
	NodeFunc = nil
	if r := runCLI(t, "", "node", "--token-file", tokenFile); r.code != 1 || !strings.Contains(r.stderr, "without a node agent") {
		t.Errorf("no NodeFunc: %d %q", r.code, r.stderr)
	}
}
