package network

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"

	"github.com/evalbox/evalbox/internal/netrules"
)

// clientPump carries the sandbox's bytes of one proxied connection to its
// server, judging every name they ask for on the way (proxy.go): the first
// bytes of a client that spoke late, and the Host of every request of a
// plain-HTTP connection. A refusal ends the connection.
type clientPump struct {
	g     *gateway
	st    *egressState
	pc    *proxyConn
	kind  int    // what the first bytes were (peekName)
	first string // the name the connection was allowed by, if any
	late  bool   // nothing came before the proxy stopped waiting
}

// errRefused ends a connection whose later bytes the rules refuse.
var errRefused = errors.New("network: refused by the rules")

// maxHead bounds the head of one HTTP request.
const maxHead = 64 << 10

// run copies the client's bytes (peeked first) to server until the
// client's end of sending (nil) or a refusal or failure (an error).
func (p *clientPump) run(server *net.TCPConn, peeked []byte) error {
	src := io.MultiReader(bytes.NewReader(peeked), p.pc.client)
	kind := p.kind
	if p.late {
		// Judged on its first bytes, when they come (within lateWait).
		name, k, more := peekName(p.pc.client, peeked, lateWait)
		r := p.st.currentRules()
		switch {
		case k == kindNone && len(more) == 0:
			return nil // it ended, or stayed silent: nothing to carry
		case k == kindNone:
			return errRefused // what it began did not end within the wait
		case k == kindTLS && !p.nameOK(r, name), k == kindBad && !r.Addr(p.pc.dialed):
			p.g.m.log.Debug("network: egress refused: a late name", "name", name, "dst", p.pc.origDst)
			return errRefused
		}
		if name != "" {
			p.pc.setName(name)
		}
		kind, src = k, io.MultiReader(bytes.NewReader(more), p.pc.client)
	}
	if kind == kindHTTP {
		return p.http(server, bufio.NewReaderSize(src, maxLine))
	}
	_, err := io.Copy(server, src)
	return err
}

// nameOK reports whether a connection already dialled may carry name h
// ("" none: its address decided) under r: not denied, and the address
// dialled is one of h's (the name it was dialled for, one the resolver gave
// this sandbox for h, or one the proxy resolves h to), or a CIDR allow
// covers it.
func (p *clientPump) nameOK(r *netrules.Rules, h string) bool {
	switch {
	case h == "":
		return true
	case r.NameDenied(h):
		return false
	case r.Addr(p.pc.dialed):
		return true
	case !r.Name(h):
		return false
	case p.pc.byName && h == p.first:
		return true
	}
	if n, ok := p.st.nameOf(p.pc.dialed); ok && n == h {
		return true
	}
	return slices.Contains(p.g.lookup(h), p.pc.dialed)
}

// http carries plain-HTTP requests, each judged on its Host before any of
// it reaches the server. A request that switches protocols (Upgrade,
// CONNECT) is followed by the new protocol's bytes, copied as they are,
// unless they look like another request (its server did not switch).
func (p *clientPump) http(server io.Writer, br *bufio.Reader) error {
	for {
		head, err := readHead(br)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil || badHead(head, req) {
			// What the proxy cannot read with certainty, no server
			// reads for it.
			return errRefused
		}
		host, ok := requestName(head, req)
		if !ok {
			return errRefused
		}
		if !p.nameOK(p.st.currentRules(), host) {
			p.g.m.log.Debug("network: egress refused: a request's Host", "host", host, "dst", p.pc.origDst)
			return errRefused
		}
		if host != "" {
			p.pc.setName(host)
		}
		if _, err := server.Write(head); err != nil {
			return err
		}
		if err := copyBody(server, br, req); err != nil {
			return err
		}
		if req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
			// The new protocol's bytes go raw (WebSocket frames and TLS
			// start with bytes no request starts with); a request (its
			// server did not switch) is judged as any.
			b, err := br.Peek(1)
			if err != nil {
				return nil // the client's end
			}
			if !isTokenChar(b[0]) && !strings.ContainsRune(" \t\r\n", rune(b[0])) {
				_, err := io.Copy(server, br)
				return err
			}
		}
	}
}

// hostName is the name of a Host header: without its port, "" for an
// address (no name).
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return ""
	}
	return canonical(host)
}

// readHead reads one request head, blank lines before it dropped, up to
// and with its final blank line (io.EOF: the client ended between
// requests).
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if err == io.EOF && len(head) == 0 && len(line) == 0 {
				return nil, io.EOF
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, errRefused
			}
			return nil, err
		}
		blank := len(bytes.TrimRight(line, "\r\n")) == 0
		if blank && len(head) == 0 {
			continue // before the request line
		}
		head = append(head, line...)
		if len(head) > maxHead {
			return nil, errRefused
		}
		if blank {
			return head, nil
		}
	}
}

// ambiguousFraming reports a request whose body's length two servers could
// read apart (request smuggling: the proxy would judge one request where
// the server sees two), from its raw head: both a length and a transfer
// coding, several of either, or a coding other than chunked.
func ambiguousFraming(head []byte) bool {
	var te, cl []string
	for _, line := range bytes.Split(head, []byte("\n"))[1:] {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(string(k))) {
		case "transfer-encoding":
			te = append(te, strings.TrimSpace(string(v)))
		case "content-length":
			cl = append(cl, strings.TrimSpace(string(v)))
		}
	}
	return len(cl) > 1 || len(te) > 1 || (len(te) == 1 && (len(cl) > 0 || !strings.EqualFold(te[0], "chunked")))
}

// copyBody copies the request's body, as framed, from br to server:
// Content-Length bytes, or the chunks (re-chunked) and their trailer.
func copyBody(server io.Writer, br *bufio.Reader, req *http.Request) error {
	switch {
	case len(req.TransferEncoding) > 0:
		cw := httputil.NewChunkedWriter(server)
		if _, err := io.Copy(cw, httputil.NewChunkedReader(br)); err != nil {
			return err
		}
		if err := cw.Close(); err != nil {
			return err
		}
		// The trailer, to its blank line.
		tr := textproto.NewReader(br)
		for {
			line, err := tr.ReadLineBytes()
			if err != nil {
				return err
			}
			if _, err := server.Write(append(line, '\r', '\n')); err != nil {
				return err
			}
			if len(line) == 0 {
				return nil
			}
		}
	case req.ContentLength > 0:
		_, err := io.CopyN(server, br, req.ContentLength)
		return err
	}
	return nil
}
