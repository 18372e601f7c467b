package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
	"github.com/evalbox/evalbox/internal/tlstest"
)

// TestNodeMutualTLS: a node started with --tls-cert/--tls-key/--tls-client-ca
// serves a control plane with a certificate of the CA and the token, and
// neither one without a certificate nor a plaintext one.
func TestNodeMutualTLS(t *testing.T) {
	c := startCluster(t, true)
	ca := tlstest.NewCA(t)
	cert, key := ca.Issue(t, "node", true)
	cpCert, cpKey := ca.Issue(t, "control-plane", false)
	caFile := ca.File
	n := startNode(t, c, nodeOptions{id: "node-tls", args: []string{"--runtimes", "namespaces",
		"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", caFile}})
	n.waitReady(2 * time.Minute)

	runtimes := func(certFile, keyFile string) ([]string, error) {
		cfg, err := grpcnode.ClientTLS(certFile, keyFile, caFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ServerName = "node"
		cc, err := grpcnode.Dial(n.addr, grpcnode.ClientConfig{Token: n.token, TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		return grpcnode.NewClient(cc).Runtimes(ctxT(t, 10*time.Second))
	}
	if rts, err := runtimes(cpCert, cpKey); err != nil || !slices.Equal(rts, []string{"namespaces"}) {
		t.Errorf("a control plane of the CA: %v, %v", rts, err)
	}
	if _, err := runtimes("", ""); err == nil {
		t.Error("a client without a certificate was served")
	}
	if _, err := n.client(t, n.token).Runtimes(ctxT(t, 5*time.Second)); err == nil {
		t.Error("a plaintext client was served by a TLS node")
	}
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
}
