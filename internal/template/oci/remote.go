package oci

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// A pull from a registry is a request the server makes on a user's
// behalf: without care, `image=127.0.0.1:8080/x` or a registry's
// redirect, or its token realm, makes the server fetch its own internal
// services (the metadata service of a cloud host, an admin port) and show
// what they answered. So every connection go-containerregistry opens for
// a pull — to the registry, to where it redirects, to its token realm —
// goes through one dialer that refuses loopback, private, link-local
// (cloud metadata), and other non-public addresses, checked on the address
// actually connected to, after DNS resolution (a name that resolves to
// 127.0.0.1, or that resolves differently the second time, is refused
// too). Only registries the operator allows (Importer.AllowRegistries,
// `evalbox serve --registry-allow`) may be on such addresses; when the
// list is set, no other registry may be named. Errors never carry what a
// registry answered: its status and error codes only.

// ErrRegistryRefused is wrapped when a registry, or a connection a pull
// would make, is refused (the address, or the allow-list).
var ErrRegistryRefused = errors.New("registry refused")

// refusedError is a connection refused for its address.
type refusedError struct {
	addr string
	why  string
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("%v: %s is %s; a registry there must be allowed by the server's operator (evalbox serve --registry-allow)",
		ErrRegistryRefused, e.addr, e.why)
}

func (e *refusedError) Unwrap() error { return ErrRegistryRefused }

// notPublic lists the address ranges a pull never connects to, but for an
// allowed registry, with what they are.
var notPublic = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a non-routable address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (where cloud metadata services answer)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "a reserved address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("192.88.99.0/24"), "a reserved address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("64:ff9b::/96"), "a NAT64 address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard address"},
	{netip.MustParsePrefix("2001::/23"), "a reserved address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("2002::/16"), "a 6to4 address"},
	{netip.MustParsePrefix("fc00::/7"), "a private (unique local) address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// checkAddr refuses addr (an IP, as connected to) unless it is public.
func checkAddr(a netip.Addr) error {
	a = a.WithZone("").Unmap()
	for _, np := range notPublic {
		if np.prefix.Contains(a) {
			return &refusedError{addr: a.String(), why: np.what}
		}
	}
	return nil
}

// AllowList is the registries a pull may use, normalized: "host" (any
// port) or "host:port", lower case.
type AllowList []string

// ParseAllowList checks and normalizes entries of the form HOST[:PORT]
// (a name or an IP; IPv6 in brackets with a port).
func ParseAllowList(entries []string) (AllowList, error) {
	var out AllowList
	for _, e := range entries {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		u, err := url.Parse("//" + e)
		if err != nil || u.Host != e || u.User != nil || u.Hostname() == "" {
			return nil, fmt.Errorf("oci: registry %q: want HOST or HOST:PORT", e)
		}
		if strings.HasSuffix(e, ":") {
			return nil, fmt.Errorf("oci: registry %q: empty port", e)
		}
		out = append(out, e)
	}
	return out, nil
}

// allows reports whether hostport ("host:port", as dialed or as a
// registry reference names it; port "" when not given) is on the list.
func (l AllowList) allows(host, port string) bool {
	host = strings.ToLower(strings.Trim(host, "[]"))
	for _, e := range l {
		u, _ := url.Parse("//" + e)
		if strings.Trim(u.Hostname(), "[]") != host {
			continue
		}
		if u.Port() == "" || u.Port() == port {
			return true
		}
	}
	return false
}

// defaultPort is the port a registry reference without one is spoken to
// on (go-containerregistry: plain HTTP for localhost and private
// addresses, else HTTPS).
func defaultPort(reg name.Registry) string {
	if reg.Scheme() == "http" {
		return "80"
	}
	return "443"
}

// CheckRemote checks, before anything is fetched, that ref is a registry
// reference this importer may pull: on the allow-list when there is one,
// and not naming a non-public address (a literal IP) unless allowed. A
// name that resolves to such an address is refused when the pull
// connects.
func (im *Importer) CheckRemote(ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnknownRef, err)
	}
	reg := r.Context().Registry
	host, port := reg.RegistryStr(), ""
	if h, p, err := net.SplitHostPort(host); err == nil {
		host, port = h, p
	} else {
		port = defaultPort(reg)
	}
	if im.AllowRegistries.allows(host, port) {
		return nil
	}
	if len(im.AllowRegistries) > 0 {
		return fmt.Errorf("%w: %s is not one of the registries this server pulls from (evalbox serve --registry-allow: %s)",
			ErrRegistryRefused, reg.RegistryStr(), strings.Join(im.AllowRegistries, ", "))
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return checkAddr(a)
	}
	return nil
}

// transport is the HTTP transport of pulls: every connection is checked
// by the guarded dialer, and every request (redirects and token realms
// included) by guardRequests. HTTP(S)_PROXY is not used: a proxy would
// connect for us, past the check.
func (im *Importer) transport() http.RoundTripper {
	plain := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	guarded := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: cannot check the address %q", ErrRegistryRefused, address)
			}
			return checkAddr(ap.Addr())
		}}
	allow := im.AllowRegistries
	t := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err == nil && allow.allows(host, port) {
				return plain.DialContext(ctx, network, addr)
			}
			return guarded.DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		ExpectContinueTimeout: time.Second,
	}
	return guardRequests{next: t, allow: allow}
}

// guardRequests refuses, before dialing, a request whose URL is not HTTP
// or HTTPS, or names a non-public IP that is not allowed: every request of
// a pull passes here, the registry's redirects and its token realm's
// included (the dialer checks names once resolved).
type guardRequests struct {
	next  http.RoundTripper
	allow AllowList
}

func (g guardRequests) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: a %q URL", ErrRegistryRefused, u.Scheme)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if !g.allow.allows(u.Hostname(), port) {
		if a, err := netip.ParseAddr(u.Hostname()); err == nil {
			if err := checkAddr(a); err != nil {
				return nil, err
			}
		}
	}
	return g.next.RoundTrip(req)
}

// errorCodeRE is what a registry error code looks like (MANIFEST_UNKNOWN).
var errorCodeRE = regexp.MustCompile(`^[A-Z][A-Z_]{0,39}$`)

// remoteError describes an error of a pull without anything the registry
// (or whatever answered) sent: its HTTP status and error codes, or what
// kind of failure it was. The importer's own errors about the image's
// content are kept.
func remoteError(err error) error {
	var (
		refused *refusedError
		terr    *transport.Error
		syn     *json.SyntaxError
		typ     *json.UnmarshalTypeError
		dns     *net.DNSError
		op      *net.OpError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		badCert x509.CertificateInvalidError
		rec     tls.RecordHeaderError
	)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &refused):
		return refused
	case errors.Is(err, ErrRegistryRefused):
		return err
	case errors.As(err, &terr):
		var codes []string
		for _, d := range terr.Errors {
			if c := string(d.Code); errorCodeRE.MatchString(c) {
				codes = append(codes, c)
			}
		}
		msg := fmt.Sprintf("the registry answered HTTP %d %s", terr.StatusCode, http.StatusText(terr.StatusCode))
		if len(codes) > 0 {
			msg += " (" + strings.Join(codes, ", ") + ")"
		}
		if terr.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: %s", ErrUnknownRef, msg)
		}
		return errors.New(msg)
	case errors.As(err, &syn), errors.As(err, &typ):
		return invalid("the registry's answer is not a valid image manifest, index or config (not the JSON expected)")
	case errors.As(err, &dns):
		return fmt.Errorf("cannot resolve the registry's host %s", dns.Name)
	case errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &badCert):
		return errors.New("the registry's TLS certificate is not valid for it")
	case errors.As(err, &rec):
		return errors.New("the registry does not speak TLS on that port")
	case errors.As(err, &op):
		return fmt.Errorf("cannot connect to the registry (%s): %v", op.Op, op.Err)
	case errors.Is(err, ErrInvalidImage), errors.Is(err, ErrTooLarge), errors.Is(err, ErrUnknownRef),
		errors.As(err, new(*chargeError)), errors.As(err, new(*fs.PathError)), errors.As(err, new(*os.LinkError)):
		// The importer's own, and the host's.
		return err
	}
	return errors.New("pulling the image failed (the registry's answer is not shown)")
}
