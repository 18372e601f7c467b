package grpcnode

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/evalbox/evalbox/internal/tlstest"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
)

// refused checks that err is the one answer every refused call gets.
func refused(t *testing.T, what string, err error) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.Unauthenticated || st.Message() != "unauthenticated" || len(st.Details()) != 0 {
		t.Errorf("%s: %v, want Unauthenticated with nothing more", what, err)
	}
}

func rawConn(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestNoOrWrongToken(t *testing.T) {
	addr := serve(t, &fakeNode{}, ServerConfig{})
	_, err := pb.NewNodeClient(rawConn(t, addr)).Runtimes(t.Context(), &pb.RuntimesRequest{})
	refused(t, "no token", err)
	// A stream is refused before its handler reads anything.
	st, err := pb.NewNodeClient(rawConn(t, addr)).Exec(t.Context())
	if err == nil {
		_, err = st.Recv()
	}
	refused(t, "no token, exec", err)
	for _, tok := range []string{"wrong", testToken + "x", testToken[:len(testToken)-1], strings.ToUpper(testToken)} {
		_, err := dial(t, addr, ClientConfig{Token: tok}).Runtimes(t.Context())
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("token %q: %v", tok, err)
		}
	}
	// A second authorization header does not help.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer wrong", "authorization", "Bearer "+testToken)
	_, err = pb.NewNodeClient(rawConn(t, addr)).Runtimes(ctx, &pb.RuntimesRequest{})
	refused(t, "two tokens", err)
	if rts, err := dial(t, addr, ClientConfig{}).Runtimes(t.Context()); err != nil || len(rts) != 1 {
		t.Errorf("the right token: %v %v", rts, err)
	}
}

// TestPlaintextAwayFromLoopback: the token never travels in plaintext off
// the host unless allowed: the client refuses to dial, the server refuses
// such a peer.
func TestPlaintextAwayFromLoopback(t *testing.T) {
	for _, target := range []string{"10.20.30.40:7000", "node.example:7000", "[2001:db8::1]:7000", "0.0.0.0:7000"} {
		if _, err := Dial(target, ClientConfig{Token: testToken}); err == nil {
			t.Errorf("Dial %s without TLS: no error", target)
		}
		cc, err := Dial(target, ClientConfig{Token: testToken, AllowInsecure: true})
		if err != nil {
			t.Errorf("Dial %s allowed insecure: %v", target, err)
		} else {
			cc.Close()
		}
	}
	for _, target := range []string{"127.0.0.1:7000", "localhost:7000", "[::1]:7000"} {
		cc, err := Dial(target, ClientConfig{Token: testToken})
		if err != nil {
			t.Errorf("Dial %s: %v", target, err)
		} else {
			cc.Close()
		}
	}
	a := &authorizer{token: []byte("Bearer " + testToken), log: slog.New(slog.DiscardHandler)}
	withPeer := func(addr string, tlsInfo bool) context.Context {
		p := &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 5000}}
		if tlsInfo {
			p.AuthInfo = credentials.TLSInfo{}
		}
		ctx := peer.NewContext(context.Background(), p)
		return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+testToken))
	}
	refused(t, "plaintext from 10.0.0.1", a.check(withPeer("10.0.0.1", false)))
	if err := a.check(withPeer("10.0.0.1", true)); err != nil {
		t.Errorf("TLS from 10.0.0.1: %v", err)
	}
	if err := a.check(withPeer("127.0.0.1", false)); err != nil {
		t.Errorf("plaintext from loopback: %v", err)
	}
	a.allowInsecure = true
	if err := a.check(withPeer("10.0.0.1", false)); err != nil {
		t.Errorf("plaintext from 10.0.0.1, allowed: %v", err)
	}
	if _, err := NewServer(&fakeNode{}, ServerConfig{}); err == nil {
		t.Error("a server without a token")
	}
}

// rawCodec sends bytes as they are: a client that speaks no protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestHostileFrames: garbage, an oversized message and a protocol
// violation each end their call with an error; the server stays up.
func TestHostileFrames(t *testing.T) {
	addr := serve(t, &fakeNode{}, ServerConfig{})
	cc := rawConn(t, addr, grpc.WithPerRPCCredentials(tokenCredentials{header: "Bearer " + testToken}))
	send := func(method string, msgs ...[]byte) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method,
			grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(64<<20))
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if err := st.SendMsg(&m); err != nil {
				break
			}
		}
		st.CloseSend()
		var out []byte
		for {
			if err := st.RecvMsg(&out); err != nil {
				return err
			}
		}
	}
	stdinMsg := []byte{0x12, 0x02, 'h', 'i'} // ExecClientMessage{stdin: "hi"}
	for name, tc := range map[string]struct {
		method string
		msgs   [][]byte
		code   codes.Code
	}{
		"garbage":          {"/evalbox.node.v1.Node/Exec", [][]byte{{0xff, 0xff, 0xff, 0xff, 0x0f, 0x01}}, codes.Internal},
		"oversized":        {"/evalbox.node.v1.Node/WriteFile", [][]byte{bytes.Repeat([]byte{0x12}, 20<<20)}, codes.ResourceExhausted},
		"stdin first":      {"/evalbox.node.v1.Node/Exec", [][]byte{stdinMsg}, codes.InvalidArgument},
		"data first":       {"/evalbox.node.v1.Node/WriteFile", [][]byte{{0x12, 0x01, 'x'}}, codes.InvalidArgument},
		"unknown method":   {"/evalbox.node.v1.Node/Nope", [][]byte{{}}, codes.Unimplemented},
		"unknown service":  {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", [][]byte{{}}, codes.Unimplemented},
		"garbage on unary": {"/evalbox.node.v1.Node/Stat", [][]byte{{0x0a, 0xff}}, codes.Internal},
	} {
		err := send(tc.method, tc.msgs...)
		if st, _ := status.FromError(err); st.Code() != tc.code {
			t.Errorf("%s: %v, want %s", name, err, tc.code)
		}
	}
	if _, err := dial(t, addr, ClientConfig{}).Runtimes(t.Context()); err != nil {
		t.Fatalf("the server after hostile frames: %v", err)
	}
}

// TestMutualTLS: a node with mutual TLS serves a client with a certificate
// of its CA, and no client without one.
func TestMutualTLS(t *testing.T) {
	ca := tlstest.NewCA(t)
	nodeCert, nodeKey := ca.Issue(t, "node", true)
	cpCert, cpKey := ca.Issue(t, "cp", false)
	strangerCert, strangerKey := tlstest.NewCA(t).Issue(t, "stranger", false)
	caFile := ca.File
	srvTLS, err := ServerTLS(nodeCert, nodeKey, caFile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(&fakeNode{}, ServerConfig{Token: testToken, TLS: srvTLS, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	addr := ln.Addr().String()
	call := func(cert, key string) error {
		cfg, err := ClientTLS(cert, key, caFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ServerName = "node"
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = dial(t, addr, ClientConfig{TLS: cfg}).Runtimes(ctx)
		return err
	}
	if err := call(cpCert, cpKey); err != nil {
		t.Errorf("a client of the CA: %v", err)
	}
	if err := call("", ""); err == nil {
		t.Error("a client without a certificate was served")
	}
	if err := call(strangerCert, strangerKey); err == nil {
		t.Error("a client of another CA was served")
	}
	// Plaintext to a TLS node: no answer.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := dial(t, addr, ClientConfig{}).Runtimes(ctx); err == nil {
		t.Error("a plaintext client was served by a TLS node")
	}
}
