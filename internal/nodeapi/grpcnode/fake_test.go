package grpcnode

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/evalbox/evalbox/internal/nodeapi"
)

// fakeNode answers Runtimes and fails Stat with err; the other methods are
// those of the nil interface it embeds (the tests here do not call them).
type fakeNode struct {
	nodeapi.Node
	err error
}

func (f *fakeNode) Runtimes(context.Context) ([]string, error) { return []string{"fake"}, nil }

func (f *fakeNode) Stat(context.Context, string, string) (nodeapi.FileInfo, error) {
	return nodeapi.FileInfo{}, f.err
}

func (f *fakeNode) Exec(ctx context.Context, id string, req nodeapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	if stdin != nil {
		_, _ = io.Copy(stdout, stdin)
	}
	return nodeapi.ExitInfo{Status: nodeapi.StatusExited}, nil
}

const testToken = "test-token-0123456789abcdef"

// serve serves n on a loopback listener until the test ends and returns
// its address.
func serve(t testing.TB, n nodeapi.Node, cfg ServerConfig) string {
	t.Helper()
	if cfg.Token == "" {
		cfg.Token = testToken
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := NewServer(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// dial returns a Client of the node at addr.
func dial(t testing.TB, addr string, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Token == "" {
		cfg.Token = testToken
	}
	cc, err := Dial(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return NewClient(cc)
}
