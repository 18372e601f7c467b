// Package netrules is a sandbox's egress rules: lists of allowed and denied
// destinations, each a CIDR (IPv4 or IPv6), an exact domain name or a
// wildcard (*.domain: its subdomains, not the domain itself), where a deny
// wins over an allow (docs/design/network.md). It parses and checks what a
// request gives, at the edge, and answers the questions the egress proxy
// and the resolver ask: may this sandbox reach this name, this address?
// It knows nothing of the addresses evalbox always refuses (the host,
// private ranges, other sandboxes): those are refused before the rules are
// asked.
package netrules

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// MaxEntries is the most entries one list may hold.
const MaxEntries = 256

// Rules is a parsed, checked rule set. The zero value allows nothing.
type Rules struct {
	allow, deny list
}

// list is one parsed list: its prefixes, exact names and wildcard
// suffixes ("*.example.com" is kept as ".example.com").
type list struct {
	prefixes []netip.Prefix
	names    map[string]bool
	suffixes []string
}

// EntryError is a bad entry of a list: which list, where, and why.
type EntryError struct {
	List  string // "allow" or "deny"
	Index int
	Entry string
	Err   error
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("network.%s[%d]: %q: %v", e.List, e.Index, e.Entry, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }

// ErrTooMany is a list of more than MaxEntries entries.
var ErrTooMany = fmt.Errorf("more than %d entries", MaxEntries)

// Parse checks and parses the allow and deny lists. The first bad entry
// is an *EntryError that names it; a list that is too long wraps
// ErrTooMany.
func Parse(allow, deny []string) (*Rules, error) {
	var r Rules
	var err error
	if r.allow, err = parseList("allow", allow); err != nil {
		return nil, err
	}
	if r.deny, err = parseList("deny", deny); err != nil {
		return nil, err
	}
	return &r, nil
}

func parseList(name string, entries []string) (list, error) {
	if len(entries) > MaxEntries {
		return list{}, fmt.Errorf("network.%s: %w", name, ErrTooMany)
	}
	l := list{names: map[string]bool{}}
	for i, e := range entries {
		kind, v, err := ParseEntry(e)
		if err != nil {
			return list{}, &EntryError{List: name, Index: i, Entry: e, Err: err}
		}
		switch kind {
		case KindCIDR:
			l.prefixes = append(l.prefixes, v.(netip.Prefix))
		case KindDomain:
			l.names[v.(string)] = true
		case KindWildcard:
			l.suffixes = append(l.suffixes, v.(string))
		}
	}
	return l, nil
}

// Kinds of entry.
const (
	KindCIDR     = "cidr"
	KindDomain   = "domain"
	KindWildcard = "wildcard"
)

// ParseEntry parses one entry: a CIDR (netip.Prefix, masked; a bare
// address is not one: write /32 or /128), an exact domain (its canonical
// form: lower case, no trailing dot) or a wildcard (".suffix").
func ParseEntry(e string) (kind string, v any, err error) {
	if e == "" {
		return "", nil, errors.New("empty")
	}
	if strings.ContainsAny(e, "/:") || isIPv4Like(e) {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			if _, aerr := netip.ParseAddr(e); aerr == nil {
				return "", nil, errors.New("an address, not a CIDR: add /32 (IPv4) or /128 (IPv6)")
			}
			return "", nil, errors.New("bad CIDR")
		}
		if p.Addr().Zone() != "" {
			return "", nil, errors.New("bad CIDR: a zone is not allowed")
		}
		if p.Masked() != p {
			return "", nil, fmt.Errorf("bad CIDR: host bits set (did you mean %s?)", p.Masked())
		}
		return KindCIDR, p, nil
	}
	if rest, ok := strings.CutPrefix(e, "*."); ok {
		name, err := canonicalName(rest)
		if err != nil {
			return "", nil, err
		}
		if !strings.Contains(name, ".") {
			return "", nil, errors.New("a wildcard needs a domain of at least two labels (*.example.com)")
		}
		return KindWildcard, "." + name, nil
	}
	if strings.Contains(e, "*") {
		return "", nil, errors.New("a wildcard is *.domain, at the start only")
	}
	name, err := canonicalName(e)
	if err != nil {
		return "", nil, err
	}
	return KindDomain, name, nil
}

// isIPv4Like reports whether s is made of digits and dots only (an IPv4
// address or prefix without its mask, rather than a name).
func isIPv4Like(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && c != '.' {
			return false
		}
	}
	return true
}

// canonicalName checks a DNS name (letters, digits, hyphens, underscores
// in labels of 1 to 63 bytes, at most 253 bytes in all, not all-numeric
// at the end) and returns it in lower case without a trailing dot.
func canonicalName(s string) (string, error) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if s == "" || len(s) > 253 {
		return "", errors.New("bad domain: empty or longer than 253 bytes")
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", errors.New("bad domain: an empty label or one longer than 63 bytes")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", errors.New("bad domain: a label starts or ends with a hyphen")
		}
		for _, c := range l {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
				return "", fmt.Errorf("bad domain: %q is not allowed in a name", c)
			}
		}
	}
	if isIPv4Like(labels[len(labels)-1]) {
		return "", errors.New("bad domain: the last label is numeric")
	}
	return s, nil
}

// Name reports whether the rules allow connecting to name (as the SNI or
// Host of a connection, or a DNS question): an allow entry matches it and
// no deny entry does. CIDR entries do not match names.
func (r *Rules) Name(name string) bool {
	n, err := canonicalName(name)
	if err != nil {
		return false
	}
	return r.allow.matchName(n) && !r.deny.matchName(n)
}

// NameDenied reports whether a deny entry matches name (a name denied
// outright, whatever its addresses).
func (r *Rules) NameDenied(name string) bool {
	n, err := canonicalName(name)
	return err != nil || r.deny.matchName(n)
}

// Addr reports whether the rules allow connecting to ip by its address:
// an allow CIDR covers it and no deny CIDR does.
func (r *Rules) Addr(ip netip.Addr) bool {
	ip = ip.Unmap()
	return r.allow.matchAddr(ip) && !r.deny.matchAddr(ip)
}

// AddrDenied reports whether a deny CIDR covers ip: refused even for an
// allowed name that resolves to it.
func (r *Rules) AddrDenied(ip netip.Addr) bool { return r.deny.matchAddr(ip.Unmap()) }

func (l list) matchName(n string) bool {
	if l.names[n] {
		return true
	}
	for _, s := range l.suffixes {
		if strings.HasSuffix(n, s) {
			return true
		}
	}
	return false
}

func (l list) matchAddr(ip netip.Addr) bool {
	for _, p := range l.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Prefixes returns the allow and deny CIDRs (for the per-sandbox packet
// filter of traffic the proxy does not carry).
func (r *Rules) Prefixes() (allow, deny []netip.Prefix) {
	return append([]netip.Prefix(nil), r.allow.prefixes...), append([]netip.Prefix(nil), r.deny.prefixes...)
}
