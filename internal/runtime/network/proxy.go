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

// Timeouts of a proxied connection's start.
const (
	// peekWait bounds the wait for a name when the address alone would
	// not do; peekShort, when it would (a client that waits for the
	// server to speak first gets there after it).
	peekWait  = 10 * time.Second
	peekShort = 300 * time.Millisecond
	dialWait  = 10 * time.Second
	// maxPeek bounds what is read to find a name.
	maxPeek = 16 << 10
)

// proxyConn is one proxied connection, kept by its sandbox's state so
// that new rules can cut it.
type proxyConn struct {
	origDst netip.Addr // where the sandbox connected
	dialed  netip.Addr // where the proxy connected
	name    string     // the name it asked for ("" if none)
	byName  bool       // allowed by its name (else by its address)
	once    sync.Once
	client  net.Conn
	server  net.Conn
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
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
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
	name, peeked := peekName(c, wait)
	byName, ok := g.permit(st, r, dst.Addr(), name)
	if !ok {
		refuse("by the rules", "src", src, "dst", dst, "name", name)
		return
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
	if len(peeked) > 0 {
		if _, err := server.Write(peeked); err != nil {
			return
		}
	}
	pipe(c, server.(*net.TCPConn))
}

// pipe copies both ways until both directions ended, passing each
// half-close on.
func pipe(a, b *net.TCPConn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src *net.TCPConn) {
		_, err := io.Copy(dst, src)
		if err == nil {
			_ = dst.CloseWrite()
		} else {
			dst.Close()
			src.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
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
	byName, ok := g.permit(st, r, c.origDst, c.name)
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
	ctx, cancel := context.WithTimeout(context.Background(), resolveWait)
	defer cancel()
	addrs, err := g.resolver.lookup(ctx, name)
	if err != nil {
		g.m.log.Debug("network: egress proxy: resolve", "name", name, "err", err)
	}
	for _, a := range addrs {
		if ok(a) {
			out = append(out, a)
		}
	}
	return out
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

// peekName reads the start of a connection, for at most wait, and returns
// the name it asks for (the SNI of a TLS ClientHello, the Host of an
// HTTP/1 request; "" if neither, or an address) and the bytes read, which
// the caller sends on.
func peekName(c net.Conn, wait time.Duration) (string, []byte) {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var rec bytes.Buffer
	r := io.TeeReader(io.LimitReader(c, maxPeek), &rec)
	first := make([]byte, 1)
	if _, err := io.ReadFull(r, first); err != nil {
		return "", rec.Bytes()
	}
	var name string
	switch {
	case first[0] == 0x16: // a TLS handshake record
		errStop := errors.New("stop")
		conn := &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(first), r)}
		_ = tls.Server(conn, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name = h.ServerName
			return nil, errStop
		}}).Handshake()
	case first[0] >= 'A' && first[0] <= 'Z': // an HTTP method
		req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(bytes.NewReader(first), r)))
		if err == nil {
			name = req.Host
			if h, _, err := net.SplitHostPort(name); err == nil {
				name = h
			}
		}
	}
	if _, err := netip.ParseAddr(name); err == nil {
		name = "" // an address is no name
	}
	return canonical(name), rec.Bytes()
}

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
