package network

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/netrules"
)

// The egress proxy: every TCP connection of a rules sandbox arrives here
// (nat REDIRECT), and is carried to its destination only if the rules
// allow it. The name a connection asks for (TLS SNI, HTTP Host) is what
// the rules judge when it has one: the proxy resolves that name itself and
// dials one of its addresses, never an address the sandbox chose for it
// (so /etc/hosts and a spoofed SNI toward another address lead nowhere).
// A connection without a name (or whose name is not allowed) is allowed by
// its destination address only: covered by a CIDR allow, or answered to
// this sandbox by the resolver for a name the rules allow. Every address
// dialled passes gateway.refused first.
//
// A name is judged wherever it shows: a client that speaks only after the
// proxy stopped waiting is judged on its first bytes when they come, and
// every request of a plain-HTTP connection on its own Host (client.go), so
// that no later request or handshake carries another name to an address
// the sandbox may reach for one name only. What stays possible is what a
// proxy that does not decrypt cannot see: names inside TLS (HTTP/2
// connection reuse, domain fronting, encrypted client hello) on an address
// the rules allow.

// Timeouts of a proxied connection's start.
const (
	// peekWait bounds the wait for a name when the address alone would
	// not do; peekShort, when it would (a client that waits for the
	// server to speak first gets there after it).
	peekWait  = 10 * time.Second
	peekShort = 300 * time.Millisecond
	dialWait  = 10 * time.Second
	// lateWait bounds the wait for the first bytes of a client that did
	// not speak within peekShort (a protocol whose server speaks first
	// answers well within it); a silent connection is cut then.
	lateWait = time.Minute
)

// proxyConn is one proxied connection, kept by its sandbox's state so
// that new rules can cut it.
type proxyConn struct {
	origDst netip.Addr // where the sandbox connected
	dialed  netip.Addr // where the proxy connected
	byName  bool       // allowed by its name (else by its address)
	once    sync.Once
	client  net.Conn
	server  net.Conn

	mu   sync.Mutex
	name string // the name it asked for last ("" if none)
}

func (c *proxyConn) setName(n string) {
	c.mu.Lock()
	c.name = n
	c.mu.Unlock()
}

func (c *proxyConn) getName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.name
}

// cut ends the connection both ways.
func (c *proxyConn) cut() {
	c.once.Do(func() {
		if tc, ok := c.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset: the sandbox sees the cut at once
		}
		c.client.Close()
		if c.server != nil {
			c.server.Close()
		}
	})
}

func (g *gateway) serveProxy() {
	for {
		c, err := g.proxyLn.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.m.log.Warn("network: egress proxy accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if g.active.Add(1) > maxConns {
			g.active.Add(-1)
			_ = c.SetLinger(0)
			c.Close()
			continue
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.active.Add(-1)
			g.handle(c)
		}()
	}
}

// handle carries one connection, or refuses it (a reset).
func (g *gateway) handle(c *net.TCPConn) {
	refuse := func(why string, args ...any) {
		g.m.log.Debug("network: egress refused: "+why, args...)
		_ = c.SetLinger(0)
		c.Close()
	}
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	st := g.state(src)
	if st == nil {
		refuse("not a rules sandbox", "src", src)
		return
	}
	if st.active.Add(1) > maxConnsPerSandbox {
		st.active.Add(-1)
		refuse("too many connections", "src", src)
		return
	}
	defer st.active.Add(-1)
	dst, err := originalDst(c)
	if err != nil {
		refuse("no original destination", "src", src, "err", err)
		return
	}
	r := st.currentRules()
	_, ipOK := g.permit(st, r, dst.Addr(), "")
	wait := peekWait
	if ipOK {
		wait = peekShort
	}
	name, kind, peeked := peekName(c, nil, wait)
	byName, ok := g.permit(st, r, dst.Addr(), name)
	if kind == kindBad && !(r.Addr(dst.Addr()) && !r.AddrDenied(dst.Addr())) {
		ok = false // unreadable TLS or HTTP: a CIDR allow only
	}
	if !ok {
		refuse("by the rules", "src", src, "dst", dst, "name", name)
		return
	}
	if byName && name == "" {
		name, _ = st.nameOf(dst.Addr()) // a synthetic address: its name
	}
	var targets []netip.Addr
	if byName {
		targets = g.addrsFor(st, r, name, dst.Addr())
	} else if !g.refused(dst.Addr()) && !r.AddrDenied(dst.Addr()) {
		targets = []netip.Addr{dst.Addr()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialWait)
	var server net.Conn
	var dialed netip.Addr
	for _, a := range targets {
		var d net.Dialer
		if server, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, dst.Port()).String()); err == nil {
			dialed = a
			break
		}
	}
	cancel()
	if server == nil {
		refuse("no allowed address answered", "src", src, "dst", dst, "name", name, "err", err)
		return
	}
	pc := &proxyConn{origDst: dst.Addr(), dialed: dialed, name: name, byName: byName, client: c, server: server}
	st.mu.Lock()
	if st.closed || st.rules != r {
		// Removed, or new rules meanwhile: judge again under them.
		closed, nr := st.closed, st.rules
		st.mu.Unlock()
		if closed {
			pc.cut()
			return
		}
		if _, ok := g.permitConn(st, nr, pc); !ok {
			pc.cut()
			return
		}
		st.mu.Lock()
	}
	st.conns[pc] = struct{}{}
	st.mu.Unlock()
	defer func() {
		st.mu.Lock()
		delete(st.conns, pc)
		st.mu.Unlock()
		pc.cut()
	}()
	// The sandbox's bytes, judged as they come (client.go's pump).
	up := &clientPump{g: g, st: st, pc: pc, kind: kind, first: name, late: kind == kindNone}
	pipeWith(c, server.(*net.TCPConn), func(dst *net.TCPConn) error { return up.run(dst, peeked) })
}

// pipeWith carries a connection both ways until both directions ended,
// passing each half-close on: the server's bytes copied as they are, the
// client's by up (which returns nil at the client's end of sending, an
// error when it refused or failed).
func pipeWith(client, server *net.TCPConn, up func(server *net.TCPConn) error) {
	done := make(chan struct{}, 2)
	go func() {
		if err := up(server); err == nil {
			_ = server.CloseWrite()
		} else {
			client.Close()
			server.Close()
		}
		done <- struct{}{}
	}()
	go func() {
		if _, err := io.Copy(client, server); err == nil {
			_ = client.CloseWrite()
		} else {
			client.Close()
			server.Close()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// permit judges a connection to dst that asks for name ("" if none) under
// r: whether it is allowed, and whether by its name (then the proxy dials
// the name's own addresses). A connection that names a host is judged by
// that name: allowed, or else only when a CIDR allow covers its address;
// a name denied outright is refused whatever the address. One without a
// name is judged by its address: a CIDR, or the resolver's answer to this
// sandbox for an allowed name.
func (g *gateway) permit(st *egressState, r *netrules.Rules, dst netip.Addr, name string) (byName, ok bool) {
	if name != "" {
		switch {
		case r.NameDenied(name):
			return false, false
		case r.Name(name):
			return true, true
		}
		return false, !synthRange.Contains(dst) && r.Addr(dst) && !r.AddrDenied(dst)
	}
	if synthRange.Contains(dst) {
		// A synthetic address stands for its name only.
		n, known := st.nameOf(dst)
		if known && r.Name(n) {
			return true, true
		}
		return false, false
	}
	if r.AddrDenied(dst) {
		return false, false
	}
	if r.Addr(dst) {
		return false, true
	}
	if n, known := st.nameOf(dst); known && r.Name(n) {
		return false, true
	}
	return false, false
}

// permitConn judges an open connection again (new rules).
func (g *gateway) permitConn(st *egressState, r *netrules.Rules, c *proxyConn) (bool, bool) {
	if r == nil {
		return false, false
	}
	name := c.getName()
	byName, ok := g.permit(st, r, c.origDst, name)
	if ok && c.byName && !byName {
		// Dialled for its name, which the rules no longer allow (only
		// a CIDR covering the sandbox's own destination does).
		ok = r.Addr(c.dialed)
	}
	if ok && r.AddrDenied(c.dialed) {
		ok = false
	}
	return byName, ok
}

// addrsFor returns the addresses to dial for name: dst first when the
// resolver gave it to this sandbox for that name, then the name's
// addresses as the proxy resolves them; none that is refused or that a
// deny CIDR covers.
func (g *gateway) addrsFor(st *egressState, r *netrules.Rules, name string, dst netip.Addr) []netip.Addr {
	var out []netip.Addr
	ok := func(a netip.Addr) bool { return !g.refused(a) && !r.AddrDenied(a) && !slices.Contains(out, a) }
	if n, known := st.nameOf(dst); known && n == canonical(name) && !synthRange.Contains(dst) && ok(dst) {
		out = append(out, dst)
	}
	for _, a := range g.lookup(name) {
		if ok(a) {
			out = append(out, a)
		}
	}
	return out
}

// lookup returns name's addresses as the upstream resolvers give them,
// remembered for a little while (many connections ask for one name).
func (g *gateway) lookup(name string) []netip.Addr {
	g.cacheMu.Lock()
	e, ok := g.cache[name]
	g.cacheMu.Unlock()
	if ok && time.Now().Before(e.until) {
		return e.addrs
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveWait)
	defer cancel()
	addrs, err := g.resolver.lookup(ctx, name)
	if err != nil {
		g.m.log.Debug("network: egress proxy: resolve", "name", name, "err", err)
		return nil
	}
	g.cacheMu.Lock()
	if len(g.cache) >= maxCached {
		clear(g.cache)
	}
	g.cache[name] = cached{addrs: addrs, until: time.Now().Add(cacheTTL)}
	g.cacheMu.Unlock()
	return addrs
}

// The proxy's cache of names' addresses.
const (
	cacheTTL  = 30 * time.Second
	maxCached = 4096
)

type cached struct {
	addrs []netip.Addr
	until time.Time
}

// originalDst is where a redirected connection was headed
// (SO_ORIGINAL_DST).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// A sockaddr_in in the ipv6_mreq's 20 bytes: family, port
		// (big endian), address.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
	})
	if err == nil {
		err = serr
	}
	return ap, err
}

// What a connection's first bytes are.
const (
	kindNone  = iota // undecided: too few bytes came within the wait
	kindTLS          // a TLS handshake
	kindHTTP         // an HTTP/1 request (blank lines before it allowed)
	kindOther        // anything else
	// kindBad looks like TLS or HTTP but cannot be read with certainty:
	// carried only where a CIDR allow covers the address, never on the
	// strength of a name's address (its name is unknown).
	kindBad
)

// Bounds of what is read to judge a connection's start: the first line
// and an HTTP head (as lenient servers read them: 8 KiB lines and more),
// a TLS ClientHello (up to the record layer's size).
const (
	maxLine = 16 << 10
	maxPeek = 64 << 10
)

// peekName reads the start of a connection (prefix, bytes read from it
// before, then c), for at most wait (0: no bound), and returns the name it
// asks for (the SNI of a TLS ClientHello, the Host of an HTTP/1 request's
// head; "" if neither, or an address), what it is, and every byte read,
// which the caller sends on. Undecided (kindNone) when what came within
// the wait does not say: the caller reads on (late) with these bytes as
// the prefix.
func peekName(c net.Conn, prefix []byte, wait time.Duration) (string, int, []byte) {
	if wait > 0 {
		_ = c.SetReadDeadline(time.Now().Add(wait))
		defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	}
	var rec bytes.Buffer
	rec.Write(prefix)
	cr := &errReader{r: c}
	from := io.MultiReader(bytes.NewReader(prefix), io.TeeReader(io.LimitReader(cr, maxPeek), &rec))
	br := bufio.NewReaderSize(from, maxLine)
	name, kind := classify(c, br, cr)
	if _, err := netip.ParseAddr(name); err == nil {
		name = "" // an address is no name
	}
	return canonical(name), kind, rec.Bytes()
}

// classify reads the start of a connection from br (c's bytes; cr says
// whether a read ran out of time).
func classify(c net.Conn, br *bufio.Reader, cr *errReader) (string, int) {
	first, err := br.Peek(1)
	if err != nil {
		return "", kindNone
	}
	if first[0] == 0x16 { // a TLS handshake record
		errStop := errors.New("stop")
		var name string
		var hello bool
		conn := &replayConn{Conn: c, r: br}
		_ = tls.Server(conn, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, hello = h.ServerName, true
			return nil, errStop
		}}).Handshake()
		switch {
		case hello:
			return name, kindTLS
		case cr.timedOut():
			return "", kindNone // a handshake still coming
		}
		// A hello this parser refuses (a name with a trailing dot, too
		// large), which another may take.
		return "", kindBad
	}
	switch mayBeRequest(br) {
	case notHTTP:
		return "", kindOther
	case undecided:
		if cr.timedOut() {
			return "", kindNone
		}
		return "", kindOther // the client ended before a whole line
	case tooLong:
		return "", kindBad
	}
	head, err := readHead(br)
	if err != nil {
		if cr.timedOut() {
			return "", kindNone
		}
		return "", kindBad
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil || badHead(head, req) {
		return "", kindBad
	}
	h, ok := requestName(head, req)
	if !ok {
		return "", kindBad
	}
	return h, kindHTTP
}

// What the first line of a connection is (mayBeRequest).
const (
	notHTTP   = iota // no HTTP request line
	undecided        // no whole line came
	tooLong          // an HTTP-like line longer than maxLine
	isHTTP           // an HTTP/1 request line (it names a version)
)

// mayBeRequest peeks at the first line (blank lines before it skipped):
// an HTTP request line is a method token, a space, and a version
// ("HTTP/"). Bytes that cannot start one (a binary protocol's, a banner
// without a space after its first word) say so at once.
func mayBeRequest(br *bufio.Reader) int {
	for n := 1; ; {
		b, err := br.Peek(n)
		if line := bytes.TrimLeft(b, "\r\n"); len(line) > 0 {
			end := bytes.IndexByte(line, '\n')
			whole := end >= 0
			if whole {
				line = line[:end]
			}
			method := line
			if sp := bytes.IndexByte(line, ' '); sp >= 0 {
				method = line[:sp]
			}
			for _, ch := range method {
				if !isTokenChar(ch) && ch != '\r' {
					return notHTTP
				}
			}
			if whole {
				if len(method) < len(line) && bytes.Contains(bytes.ToUpper(line), []byte(" HTTP/")) {
					return isHTTP
				}
				return notHTTP
			}
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				if bytes.Contains(bytes.ToUpper(b), []byte(" HTTP/")) {
					return tooLong
				}
				return notHTTP
			}
			return undecided
		}
		if n >= br.Size() {
			if bytes.Contains(bytes.ToUpper(b), []byte(" HTTP/")) {
				return tooLong
			}
			return notHTTP
		}
		// At least one byte more than seen, or all that is buffered.
		n = min(max(len(b)+1, br.Buffered()), br.Size())
	}
}

// isTokenChar reports an RFC 9110 token character (a method's).
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// badHead reports a head that servers could read otherwise than the
// proxy: folded header lines, a transfer coding on HTTP/1.0, a length and
// a coding at once (ambiguousFraming).
func badHead(head []byte, req *http.Request) bool {
	lines := bytes.Split(head, []byte("\n"))
	for _, l := range lines[1:] {
		if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
			return true
		}
	}
	if !req.ProtoAtLeast(1, 1) && bytes.Contains(bytes.ToLower(head), []byte("transfer-encoding")) {
		return true
	}
	return ambiguousFraming(head)
}

// requestName is the name a request asks for: its Host header, which an
// absolute-form target's authority must agree with (false otherwise; Go
// takes the target's, a server may take the header's).
func requestName(head []byte, req *http.Request) (string, bool) {
	var header []string
	for _, l := range bytes.Split(head, []byte("\n"))[1:] {
		if k, v, ok := bytes.Cut(l, []byte(":")); ok && strings.EqualFold(strings.TrimSpace(string(k)), "host") {
			header = append(header, strings.TrimSpace(string(v)))
		}
	}
	if len(header) > 1 {
		return "", false
	}
	h := hostName(req.Host)
	if len(header) == 1 && hostName(header[0]) != h {
		return "", false
	}
	return h, true
}

// errReader remembers whether a read failed for its deadline.
type errReader struct {
	r       io.Reader
	timeout bool
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		e.timeout = true
	}
	return n, err
}

func (e *errReader) timedOut() bool { return e.timeout }

// replayConn reads from r and writes nowhere: the TLS parser's view of a
// peeked connection (its alert must not reach the sandbox).
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *replayConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *replayConn) Close() error                { return nil }

// canonical is a name as the rules and records compare it.
func canonical(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(bytes.TrimSuffix(b, []byte(".")))
}
