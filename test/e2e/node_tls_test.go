package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
)

// pemCA is a throwaway certificate authority for a test.
type pemCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

func newPEMCA(t *testing.T) *pemCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e node CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &pemCA{cert: cert, key: key, dir: t.TempDir()}
	writePEM(t, filepath.Join(ca.dir, "ca.pem"), "CERTIFICATE", der)
	return ca
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue returns the paths of a new certificate and key: a server's for
// DNS name name, or a client's.
func (ca *pemCA) issue(t *testing.T, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tpl.DNSNames, tpl.ExtKeyUsage = []string{name}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kb)
	return certFile, keyFile
}

// TestNodeMutualTLS: a node started with --tls-cert/--tls-key/--tls-client-ca
// serves a control plane with a certificate of the CA and the token, and
// neither one without a certificate nor a plaintext one.
func TestNodeMutualTLS(t *testing.T) {
	c := startCluster(t, true)
	ca := newPEMCA(t)
	cert, key := ca.issue(t, "node", true)
	cpCert, cpKey := ca.issue(t, "control-plane", false)
	caFile := filepath.Join(ca.dir, "ca.pem")
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
