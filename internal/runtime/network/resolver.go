package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/miekg/dns"
)

// The egress resolver: the DNS of rules sandboxes (their udp and tcp 53,
// whatever the address, is redirected here). It answers A and AAAA
// questions for the names the sandbox's rules allow, asking the upstream
// resolvers (Config.Upstream), and remembers which addresses it gave for
// which name (the proxy allows connections to them). A name the rules do
// not allow is NXDOMAIN and never leaves the host: nothing a sandbox
// makes up reaches a resolver elsewhere, so DNS carries no tunnel. Other
// types of an allowed name are answered empty (no TXT, no NULL records to
// carry data). Addresses no sandbox may reach (gateway.refused) and those
// a deny CIDR covers are dropped from answers: an allowed name that
// points at 127.0.0.1 or 169.254.169.254 (DNS rebinding) resolves to
// nothing. A name with IPv6 addresses only gets a synthetic IPv4 address
// (synthBase), which the proxy dials over the host's IPv6.

const (
	resolveWait = 5 * time.Second
	// maxAnswerTTL caps the TTL given to sandboxes.
	maxAnswerTTL = 300
)

type resolver struct {
	g        *gateway
	port     int
	udp, tcp *dns.Server
}

// newResolver starts the resolver on one port of every address, UDP and
// TCP.
func newResolver(g *gateway) (*resolver, error) {
	var lastErr error
	for range 10 {
		pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
		if err != nil {
			return nil, fmt.Errorf("network: egress resolver: %w", err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4zero, Port: port})
		if err != nil {
			pc.Close()
			lastErr = err
			continue // that TCP port is taken: another pair
		}
		r := &resolver{g: g, port: port}
		r.udp = &dns.Server{PacketConn: pc, Handler: r}
		r.tcp = &dns.Server{Listener: ln, Handler: r}
		for _, s := range []*dns.Server{r.udp, r.tcp} {
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				if err := s.ActivateAndServe(); err != nil && !errors.Is(err, net.ErrClosed) {
					g.m.log.Warn("network: egress resolver stopped", "err", err)
				}
			}()
		}
		return r, nil
	}
	return nil, fmt.Errorf("network: egress resolver: %w", lastErr)
}

func (r *resolver) close() {
	for _, s := range []*dns.Server{r.udp, r.tcp} {
		if err := s.Shutdown(); err != nil {
			// Not started yet: close its socket.
			if s.PacketConn != nil {
				s.PacketConn.Close()
			}
			if s.Listener != nil {
				s.Listener.Close()
			}
		}
	}
}

// ServeDNS answers one question of a rules sandbox.
func (r *resolver) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	resp.Compress = true
	st := r.g.state(addrOf(w.RemoteAddr()))
	switch {
	case st == nil, !st.dns.Allow():
		resp.Rcode = dns.RcodeRefused
	case req.Opcode != dns.OpcodeQuery:
		resp.Rcode = dns.RcodeNotImplemented
	case len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET:
		resp.Rcode = dns.RcodeFormatError
	default:
		r.answer(st, req.Question[0], resp)
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = max(size, int(o.UDPSize()))
		}
		resp.Truncate(size)
	}
	_ = w.WriteMsg(resp)
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// answer fills resp for question q of sandbox st.
func (r *resolver) answer(st *egressState, q dns.Question, resp *dns.Msg) {
	rules := st.currentRules()
	name := canonical(q.Name)
	if rules == nil || !rules.Name(name) {
		resp.Rcode = dns.RcodeNameError
		return
	}
	if q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA {
		return // an allowed name, but no data of other types
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveWait)
	defer cancel()
	up, err := r.exchange(ctx, q.Name, q.Qtype)
	if err != nil {
		r.g.m.log.Debug("network: egress resolver: upstream", "name", name, "err", err)
		resp.Rcode = dns.RcodeServerFailure
		return
	}
	resp.Rcode = up.Rcode
	if up.Rcode != dns.RcodeSuccess {
		return
	}
	usable := func(a netip.Addr) bool { return !r.g.refused(a) && !rules.AddrDenied(a) }
	var kept []dns.RR
	for _, rr := range up.Answer {
		switch rr := rr.(type) {
		case *dns.CNAME:
			kept = append(kept, rr)
		case *dns.A, *dns.AAAA:
			a := rrAddr(rr)
			if !usable(a) {
				continue
			}
			rr.Header().Ttl = min(rr.Header().Ttl, maxAnswerTTL)
			st.remember(a, name, time.Duration(rr.Header().Ttl)*time.Second)
			kept = append(kept, rr)
		}
	}
	if q.Qtype == dns.TypeA && !slices.ContainsFunc(kept, func(rr dns.RR) bool { _, ok := rr.(*dns.A); return ok }) {
		// No IPv4 address: when the name has IPv6 ones, a synthetic
		// IPv4 one that the proxy maps back to the name.
		if v6, err := r.exchange(ctx, q.Name, dns.TypeAAAA); err == nil &&
			slices.ContainsFunc(v6.Answer, func(rr dns.RR) bool { _, ok := rr.(*dns.AAAA); return ok && usable(rrAddr(rr)) }) {
			if a, ok := st.synthFor(name); ok {
				st.remember(a, name, maxAnswerTTL*time.Second)
				kept = append(kept, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: a.AsSlice()})
			}
		}
	}
	resp.Answer = kept
}

func rrAddr(rr dns.RR) netip.Addr {
	var a netip.Addr
	switch rr := rr.(type) {
	case *dns.A:
		a, _ = netip.AddrFromSlice(rr.A.To4())
	case *dns.AAAA:
		a, _ = netip.AddrFromSlice(rr.AAAA)
	}
	return a.Unmap()
}

// exchange asks the upstream resolvers one question, the next when one
// fails, over TCP when an answer is truncated.
func (r *resolver) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.RecursionDesired = true
	m.SetEdns0(1232, false)
	var lastErr error = errors.New("no upstream resolver")
	for _, up := range r.g.m.upstream {
		for _, proto := range []string{"udp", "tcp"} {
			c := &dns.Client{Net: proto, Timeout: 2 * time.Second}
			in, _, err := c.ExchangeContext(ctx, m, up.String())
			if err != nil {
				lastErr = err
				break
			}
			if in.Truncated && proto == "udp" {
				continue
			}
			return in, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// lookup returns the addresses of name as the upstream resolvers give them,
// IPv4 first (for the proxy).
func (r *resolver) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	var out []netip.Addr
	var errs []error
	for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
		in, err := r.exchange(ctx, name, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, rr := range in.Answer {
			if rr.Header().Rrtype == t {
				if a := rrAddr(rr); a.IsValid() {
					out = append(out, a)
				}
			}
		}
	}
	if len(out) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}
