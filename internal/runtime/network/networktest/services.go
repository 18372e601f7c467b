package networktest

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// services are the fake internet's servers (DNS, HTTPS, HTTP, echo),
// listening in its namespace on every address.
type services struct {
	https, http, echo net.Listener
	udpEcho           net.PacketConn
	dnsUDP, dnsTCP    *dns.Server
	servers           []*http.Server
	wg                sync.WaitGroup
}

// listenServices opens the services' sockets; call it in the fake
// internet's namespace.
func listenServices(cert tls.Certificate) (_ *services, err error) {
	s := &services{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.https, err = net.Listen("tcp", fmt.Sprintf(":%d", HTTPSPort)); err != nil {
		return nil, err
	}
	s.https = tls.NewListener(s.https, &tls.Config{Certificates: []tls.Certificate{cert}})
	if s.http, err = net.Listen("tcp", fmt.Sprintf(":%d", HTTPPort)); err != nil {
		return nil, err
	}
	if s.echo, err = net.Listen("tcp", fmt.Sprintf(":%d", EchoPort)); err != nil {
		return nil, err
	}
	if s.udpEcho, err = net.ListenPacket("udp", fmt.Sprintf(":%d", UDPEchoPort)); err != nil {
		return nil, err
	}
	pc, err := net.ListenPacket("udp", ":53")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", ":53")
	if err != nil {
		pc.Close()
		return nil, err
	}
	h := dns.HandlerFunc(serveDNS)
	s.dnsUDP = &dns.Server{PacketConn: pc, Handler: h}
	s.dnsTCP = &dns.Server{Listener: ln, Handler: h}
	return s, nil
}

// serve starts serving.
func (s *services) serve() {
	for _, srv := range []*dns.Server{s.dnsUDP, s.dnsTCP} {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = srv.ActivateAndServe()
		}()
	}
	web := func(ln net.Listener, h http.HandlerFunc) {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		s.servers = append(s.servers, srv)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = srv.Serve(ln)
		}()
	}
	web(s.https, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls %s host %s at %s\n", r.TLS.ServerName, r.Host, localIP(r))
	})
	web(s.http, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "http host %s at %s\n", r.Host, localIP(r))
	})
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, bufio.NewReader(c))
			}()
		}
	}()
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, addr, err := s.udpEcho.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = s.udpEcho.WriteTo(buf[:n], addr)
		}
	}()
}

// localIP is the address a request came in at.
func localIP(r *http.Request) string {
	a, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if a == nil {
		return "?"
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	return ap.Addr().Unmap().String()
}

func (s *services) close() {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
	for _, ln := range []net.Listener{s.https, s.http, s.echo} {
		if ln != nil {
			_ = ln.Close()
		}
	}
	if s.udpEcho != nil {
		_ = s.udpEcho.Close()
	}
	for _, srv := range []*dns.Server{s.dnsUDP, s.dnsTCP} {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(); err != nil {
			if srv.PacketConn != nil {
				srv.PacketConn.Close()
			}
			if srv.Listener != nil {
				srv.Listener.Close()
			}
		}
	}
	s.wg.Wait()
}

// serveDNS answers from Names: A and AAAA records, NXDOMAIN for other
// names, and TXT records of any name asked (a tunnel's reply, to show
// that none gets through).
func serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Authoritative = true
	for _, q := range req.Question {
		name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
		if q.Qtype == dns.TypeTXT {
			resp.Answer = append(resp.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60},
				Txt: []string{"tunnel reply for " + name}})
			continue
		}
		addrs, ok := Names[name]
		if !ok {
			resp.Rcode = dns.RcodeNameError
			continue
		}
		for _, s := range addrs {
			a := netip.MustParseAddr(s)
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 60}
			switch {
			case a.Is4() && q.Qtype == dns.TypeA:
				hdr.Rrtype = dns.TypeA
				resp.Answer = append(resp.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case a.Is6() && q.Qtype == dns.TypeAAAA:
				hdr.Rrtype = dns.TypeAAAA
				resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
	}
	_ = w.WriteMsg(resp)
}
