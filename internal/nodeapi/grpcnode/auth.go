package grpcnode

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// errUnauthenticated is every refusal's answer: it tells a caller nothing
// of why (no token, a wrong one, plaintext from afar).
var errUnauthenticated = status.Error(codes.Unauthenticated, "unauthenticated")

// authorizer admits a call before any handler runs.
type authorizer struct {
	token         []byte // "Bearer <token>"
	allowInsecure bool
	log           *slog.Logger
}

func (a *authorizer) check(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return errUnauthenticated
	}
	_, overTLS := p.AuthInfo.(credentials.TLSInfo)
	if !overTLS && !a.allowInsecure && !isLoopback(p.Addr) {
		a.log.Warn("node call refused: plaintext from a peer not on loopback", "peer", p.Addr.String())
		return errUnauthenticated
	}
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get("authorization")
	// One compare of equal cost whatever the token given: its length is
	// the only thing a timing could tell.
	if len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), a.token) != 1 {
		a.log.Warn("node call refused: no or wrong token", "peer", p.Addr.String())
		return errUnauthenticated
	}
	return nil
}

func (a *authorizer) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := a.check(ss.Context()); err != nil {
		return err
	}
	return h(srv, ss)
}

// isLoopback reports whether addr is a loopback TCP address or a unix
// socket (local by construction).
func isLoopback(addr net.Addr) bool {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	return false
}

// isLoopbackTarget reports whether a dial target "host:port" is on
// loopback, without resolving a name other than localhost.
func isLoopbackTarget(target string) bool {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tokenCredentials sends the token with every call.
type tokenCredentials struct {
	header string
	secure bool
}

func (t tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": t.header}, nil
}

// RequireTransportSecurity makes gRPC refuse to send the token over a
// plaintext connection, unless Dial allowed one.
func (t tokenCredentials) RequireTransportSecurity() bool { return t.secure }

// ServerTLS returns the TLS configuration of a node server: its
// certificate and key (PEM files) and, when caFile is set, mutual TLS (a
// client must present a certificate signed by that CA).
func ServerTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("grpcnode: node TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	if caFile != "" {
		pool, err := loadCA(caFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientTLS returns the TLS configuration a control plane dials a node
// with: the CA that signed the node's certificate (caFile; "" = the
// system's) and, for mutual TLS, its own certificate and key.
func ClientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if caFile != "" {
		pool, err := loadCA(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("grpcnode: control plane TLS certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func loadCA(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("grpcnode: CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("grpcnode: CA: " + file + " holds no PEM certificate")
	}
	return pool, nil
}
