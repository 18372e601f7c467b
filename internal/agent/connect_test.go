package agent_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/agent"
	"github.com/evalbox/evalbox/internal/agentproto"
)

// listen serves on a loopback port of the test's network namespace (the
// in-process agent's too) with handle, and returns the port.
func listen(t testing.TB, handle func(*net.TCPConn)) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestConnect: bytes both ways through OpConnect, 8 MiB each way at once,
// with half-closes in both directions.
func TestConnect(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	// An echo server that answers once its input ended.
	port := listen(t, func(c *net.TCPConn) {
		b, _ := io.ReadAll(c)
		c.Write(b)
		c.CloseWrite()
	})
	conn, err := ta.c.Connect(ctxT(t), port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := make([]byte, 8<<20)
	rand.Read(want)
	go func() {
		conn.Write(want)
		conn.CloseWrite()
	}()
	got, err := io.ReadAll(conn)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("echo: %d bytes, %v; want %d", len(got), err, len(want))
	}
	if _, err := conn.Write([]byte("x")); err == nil {
		t.Error("a write after CloseWrite went through")
	}

	// The server speaks first and closes its side; the client still
	// writes after that, and the server reads it.
	got2 := make(chan []byte, 1)
	port2 := listen(t, func(c *net.TCPConn) {
		c.Write([]byte("hello"))
		c.CloseWrite()
		b, _ := io.ReadAll(c)
		got2 <- b
	})
	conn2, err := ta.c.Connect(ctxT(t), port2)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if b, err := io.ReadAll(conn2); err != nil || string(b) != "hello" {
		t.Fatalf("server first: %q, %v", b, err)
	}
	conn2.Write([]byte("after your end"))
	conn2.CloseWrite()
	select {
	case b := <-got2:
		if string(b) != "after your end" {
			t.Errorf("the server read %q", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not see the client's half-close")
	}
}

// TestConnectRefusedAndAborted: a port with nothing on it is
// CodeConnRefused; a bad port is a bad request; closing the client aborts
// the connection (the server sees it end) and the session goes on.
func TestConnectRefusedAndAborted(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	closedPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if _, err := ta.c.Connect(ctxT(t), closedPort); agentErrCode(err) != agentproto.CodeConnRefused {
		t.Errorf("closed port: %v", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := ta.c.Connect(ctxT(t), p); agentErrCode(err) != agentproto.CodeBadRequest {
			t.Errorf("port %d: %v", p, err)
		}
	}
	ended := make(chan struct{})
	port := listen(t, func(c *net.TCPConn) {
		c.Write([]byte("streaming"))
		io.Copy(io.Discard, c) // until the agent closes the connection
		close(ended)
	})
	conn, err := ta.c.Connect(ctxT(t), port)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the client did not end the server's connection")
	}
	if err := ta.c.Ping(ctxT(t)); err != nil {
		t.Fatalf("the session after an abort: %v", err)
	}

	// An abort after the client's half-close (a WebSocket client that
	// left while the server stays silent) ends the server's connection too.
	ended2 := make(chan struct{})
	port2 := listen(t, func(c *net.TCPConn) {
		io.Copy(io.Discard, c) // the half-close: EOF here
		// Then a trickle, until the agent closes the connection (a
		// write fails once it did).
		for {
			if _, err := c.Write([]byte{'.'}); err != nil {
				close(ended2)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	conn2, err := ta.c.Connect(ctxT(t), port2)
	if err != nil {
		t.Fatal(err)
	}
	conn2.CloseWrite()
	time.Sleep(100 * time.Millisecond)
	conn2.Close()
	select {
	case <-ended2:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the client after its half-close did not end the server's connection")
	}
}

// BenchmarkConnect: bytes from a server in the sandbox through OpConnect
// (in process, over a pipe).
func BenchmarkConnect(b *testing.B) {
	ta := startAgent(b, agent.Config{})
	chunk := make([]byte, 1<<20)
	port := listen(b, func(c *net.TCPConn) {
		for range 64 {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	b.SetBytes(64 << 20)
	for b.Loop() {
		conn, err := ta.c.Connect(ctxT(b), port)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, conn); err != nil || n != 64<<20 {
			b.Fatal(n, err)
		}
		conn.Close()
	}
}
