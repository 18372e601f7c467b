package network

import (
	"bytes"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"
)

// clientHello returns the first flight of a TLS client for name.
func clientHello(t *testing.T, name string, pad int) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		cfg := &tls.Config{ServerName: name, InsecureSkipVerify: true}
		if pad > 0 {
			// Many ALPN entries make a large hello.
			for i := 0; len(strings.Join(cfg.NextProtos, "")) < pad; i++ {
				cfg.NextProtos = append(cfg.NextProtos, strings.Repeat("p", 200)+string(rune('a'+i%26)))
			}
		}
		_ = tls.Client(a, cfg).Handshake()
	}()
	// The whole first flight: what comes until the client waits.
	buf := make([]byte, 256<<10)
	var out []byte
	for {
		b.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := b.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out
		}
	}
}

// classifyBytes runs peekName over data sent on a pipe (then the sender
// waits, as a client waiting for its server).
func classifyBytes(t *testing.T, data []byte) (string, int) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { a.Write(data) }()
	name, kind, got := peekName(b, nil, 300*time.Millisecond)
	if !bytes.HasPrefix(data, got) {
		t.Errorf("peeked bytes are not the data's start")
	}
	return name, kind
}

// TestClassify: what a connection's first bytes are, as the proxy judges
// them, including what lenient servers read and this parser may not (a
// hostile review's cases): those are kindBad, never kindOther (carried
// raw to an address allowed for another name).
func TestClassify(t *testing.T) {
	dotted := bytes.Replace(clientHello(t, "evil.examplex", 0), []byte("evil.examplex"), []byte("evil.example."), 1)
	big := clientHello(t, "big.example", 19<<10)
	longHeader := "GET / HTTP/1.1\r\nHost: a.example\r\nX-Long: " + strings.Repeat("x", 5000) + "\r\n\r\n"
	longURI := "GET /" + strings.Repeat("y", 5000) + " HTTP/1.1\r\nHost: a.example\r\n\r\n"
	manyLines := "GET / HTTP/1.1\r\nHost: a.example\r\n" + strings.Repeat("X-A: b\r\n", 2500) + "\r\n"
	tooMany := "GET / HTTP/1.1\r\nHost: a.example\r\n" + strings.Repeat("X-A: b\r\n", 9000) + "\r\n"
	for _, c := range []struct {
		name string
		data []byte
		kind int
		host string
	}{
		{"tls", clientHello(t, "Allowed.Example", 0), kindTLS, "allowed.example"},
		{"tls, trailing dot", dotted, kindBad, ""},
		{"tls, large", big, kindTLS, "big.example"},
		{"tls, not a hello", []byte{0x16, 3, 1, 0, 5, 1, 2, 3, 4, 5}, kindBad, ""},
		{"http", []byte("GET / HTTP/1.1\r\nHost: a.example:80\r\n\r\n"), kindHTTP, "a.example"},
		{"http after blank lines", []byte("\r\n\r\nGET / HTTP/1.1\r\nHost: b.example\r\n\r\n"), kindHTTP, "b.example"},
		{"http, a 5 KB header line", []byte(longHeader), kindHTTP, "a.example"},
		{"http, a 5 KB URI", []byte(longURI), kindHTTP, "a.example"},
		{"http, a 20 KB head", []byte(manyLines), kindHTTP, "a.example"},
		{"http, a 70 KB head", []byte(tooMany), kindBad, ""},
		{"http, two Hosts", []byte("GET / HTTP/1.1\r\nHost: a.example\r\nhost: evil.example\r\n\r\n"), kindBad, ""},
		{"http, a space in the URI", []byte("GET /a b HTTP/1.1\r\nHost: evil.example\r\n\r\n"), kindBad, ""},
		{"http, M-SEARCH", []byte("M-SEARCH * HTTP/1.1\r\nHost: evil.example\r\n\r\n"), kindHTTP, "evil.example"},
		{"http, _GET", []byte("_GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"), kindHTTP, "evil.example"},
		{"http, folded header", []byte("GET / HTTP/1.1\r\nHost: a.example\r\nX: y\r\n Content-Length: 43\r\n\r\n"), kindBad, ""},
		{"http/1.0 with a coding", []byte("POST / HTTP/1.0\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n"), kindBad, ""},
		{"http, absolute form elsewhere", []byte("GET http://a.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"), kindBad, ""},
		{"http, absolute form", []byte("GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n"), kindHTTP, "a.example"},
		{"http, an address", []byte("GET / HTTP/1.1\r\nHost: 198.51.100.2\r\n\r\n"), kindHTTP, ""},
		{"a line protocol", []byte("echo\n"), kindOther, ""},
		{"an ssh banner", []byte("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"), kindOther, ""},
		{"a command with an argument", []byte("AUTH secret\r\n"), kindOther, ""},
		{"binary (postgres startup)", []byte{0, 0, 0, 8, 4, 210, 22, 47}, kindOther, ""},
		{"half a request line", []byte("GET /ind"), kindNone, ""},
		{"half a hello", dotted[:20], kindNone, ""},
	} {
		host, kind := classifyBytes(t, c.data)
		if kind != c.kind || host != c.host {
			t.Errorf("%s: kind %d host %q, want kind %d host %q", c.name, kind, host, c.kind, c.host)
		}
	}
}
