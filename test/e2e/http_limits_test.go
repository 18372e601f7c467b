package e2e

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// closedWithin reports whether the server closes conn within d, reading
// (and dropping) whatever it sends; send, if set, is called every tick
// until then.
func closedWithin(conn net.Conn, d time.Duration, send func() error) bool {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = io.Copy(io.Discard, conn)
	}()
	deadline := time.After(d)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-closed:
			return true
		case <-deadline:
			return false
		case <-tick.C:
			if send != nil && send() != nil {
				// The server closed its side: the write fails.
				<-closed
				return true
			}
		}
	}
}

// TestHTTPConnectionLimits: with short limits (the hidden serve flags), a
// client sending its headers a byte at a time (slowloris) is cut off after
// the header timeout, an idle keep-alive connection is closed after the idle
// timeout, headers past 64 KiB get 431, and a streamed exec longer than
// both timeouts still runs to its end (no read or write timeout cuts it).
func TestHTTPConnectionLimits(t *testing.T) {
	t.Parallel()
	s, err := startServer(serverOptions{args: []string{"--runtimes", "namespaces",
		"--http-read-header-timeout", "1", "--http-idle-timeout", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	})

	t.Run("slowloris", func(t *testing.T) {
		conn, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if !closedWithin(conn, 10*time.Second, func() error { _, err := conn.Write([]byte("a")); return err }) {
			t.Fatal("a connection sending a header byte every 200 ms was still open after 10 s")
		}
		if d := time.Since(start); d < 900*time.Millisecond {
			t.Errorf("closed after %v, before the header timeout", d)
		}
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		conn, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("health: %d, close %v", resp.StatusCode, resp.Close)
		}
		if !closedWithin(&bufConn{Conn: conn, r: br}, 10*time.Second, nil) {
			t.Fatal("an idle keep-alive connection was still open after 10 s")
		}
	})

	t.Run("large headers", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/health", nil)
		req.Header.Set("X-Big", strings.Repeat("a", 100<<10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("100 KiB of headers: %d, want 431", resp.StatusCode)
		}
	})

	t.Run("long stream", func(t *testing.T) {
		ctx := ctxT(t, 2*time.Minute)
		sb, err := s.admin.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := s.admin.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Error(err)
			}
			assertGone(t, s, sb.ID)
		}()
		var out strings.Builder
		res, err := s.admin.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: "echo a; sleep 3; echo b"}, &out, io.Discard)
		if err != nil || res.ExitCode != 0 || out.String() != "a\nb\n" {
			t.Errorf("a 3 s streamed exec: %+v %v %q", res, err, out.String())
		}
		// And a buffered one that sends nothing for 3 s.
		r, err := s.admin.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 3; echo c"})
		if err != nil || r.Stdout != "c\n" {
			t.Errorf("a 3 s exec: %+v %v", r, err)
		}
	})
}

// bufConn reads through the bufio.Reader that already holds the start of
// the connection's input.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, io.EOF
	}
	return n, err
}
