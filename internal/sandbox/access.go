package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/netrules"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// How a sandbox may be reached and may reach out: its network mode and
// egress rules, its ports' settings, its traffic token
// (docs/design/network.md).

// network is a create's or update's network, checked.
type network struct {
	mode  string                   // none, outbound or rules
	shape string                   // the interface class (nodeapi.Shape.Network): none or outbound
	lists *client.NetworkRuleLists // mode rules: the lists as given; else nil
	// egress is the node's form of lists.
	egress *nodeapi.Egress
}

// parseNetwork checks a network spec: its mode, and in mode rules its
// lists (a bad entry is a 400 that names it).
func parseNetwork(n client.NetworkSpec) (network, error) {
	switch n.Mode {
	case "", client.NetworkNone, client.NetworkOutbound:
		if len(n.Allow) > 0 || len(n.Deny) > 0 {
			return network{}, errorf(client.CodeBadRequest, "network.allow and network.deny need mode %q, not %q", client.NetworkRules, n.Mode)
		}
		mode := n.Mode
		if mode == "" {
			mode = client.NetworkNone
		}
		return network{mode: mode, shape: mode}, nil
	case client.NetworkRules:
		if _, err := netrules.Parse(n.Allow, n.Deny); err != nil {
			return network{}, errorf(client.CodeBadRequest, "%v", err)
		}
		lists := &client.NetworkRuleLists{Allow: slices.Clone(n.Allow), Deny: slices.Clone(n.Deny)}
		if lists.Allow == nil {
			lists.Allow = []string{}
		}
		if lists.Deny == nil {
			lists.Deny = []string{}
		}
		return network{mode: client.NetworkRules, shape: client.NetworkOutbound, lists: lists,
			egress: &nodeapi.Egress{Allow: lists.Allow, Deny: lists.Deny}}, nil
	}
	return network{}, errorf(client.CodeBadRequest, "network.mode must be %q, %q or %q, got %q",
		client.NetworkNone, client.NetworkOutbound, client.NetworkRules, n.Mode)
}

// maxPortSpecs bounds a sandbox's list of port settings.
const maxPortSpecs = 64

func validatePorts(ps []client.PortSpec) error {
	if len(ps) > maxPortSpecs {
		return errorf(client.CodeBadRequest, "ports has %d entries, at most %d", len(ps), maxPortSpecs)
	}
	seen := map[int]bool{}
	for i, p := range ps {
		if p.Port < 1 || p.Port > 65535 {
			return errorf(client.CodeBadRequest, "ports[%d]: port %d: want 1 to 65535", i, p.Port)
		}
		if seen[p.Port] {
			return errorf(client.CodeBadRequest, "ports[%d]: port %d is listed twice", i, p.Port)
		}
		seen[p.Port] = true
	}
	return nil
}

// trafficTokenPrefix starts every traffic token (so that a leaked one is
// recognised, as API keys are).
const trafficTokenPrefix = "evt_"

// newTrafficToken returns a new random traffic token and its hash.
func newTrafficToken() (token, hash string) {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	token = trafficTokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	return token, hashTrafficToken(token)
}

func hashTrafficToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Access is what a port request without the team's API key may do with a
// sandbox: its team (for the calls made on its behalf), and whether the
// port is open to it.
type Access struct {
	TeamID string
	// Allowed: the port is public, or the request carries the sandbox's
	// traffic token.
	Allowed bool
}

// PortAccess tells whether a port request for port of sandbox id, which
// carries token (may be empty) and no API key, may reach it. An unknown
// sandbox is not_found; the caller answers it as it answers a refusal, so
// that no one learns which ids exist.
func (s *Service) PortAccess(ctx context.Context, id string, port int, token string) (Access, error) {
	row, err := s.store.GetSandboxAnyTeam(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Access{}, errorf(client.CodeNotFound, "sandbox %s not found", id)
	}
	if err != nil {
		return Access{}, err
	}
	a := Access{TeamID: row.TeamID}
	for _, p := range row.Ports {
		if p.Port == port && p.Public {
			a.Allowed = true
		}
	}
	if token != "" && row.TrafficTokenHash != "" &&
		subtle.ConstantTimeCompare([]byte(hashTrafficToken(token)), []byte(row.TrafficTokenHash)) == 1 {
		a.Allowed = true
	}
	return a, nil
}

// RotateTrafficToken gives the team's running sandbox a new traffic token,
// returned once; the old one stops working at once.
func (s *Service) RotateTrafficToken(ctx context.Context, teamID, id string) (string, error) {
	if _, err := s.lookup(ctx, teamID, id); err != nil {
		return "", err
	}
	token, hash := newTrafficToken()
	if err := s.store.SetTrafficTokenHash(ctx, teamID, id, hash); err != nil {
		return "", s.updateErr(id, err)
	}
	s.log.Info("sandbox traffic token rotated", "sandbox", id, "team", teamID)
	return token, nil
}

// SetPorts replaces the port settings of the team's running sandbox.
func (s *Service) SetPorts(ctx context.Context, teamID, id string, ports []client.PortSpec) (client.Sandbox, error) {
	if err := validatePorts(ports); err != nil {
		return client.Sandbox{}, err
	}
	if _, err := s.lookup(ctx, teamID, id); err != nil {
		return client.Sandbox{}, err
	}
	if err := s.store.SetPorts(ctx, teamID, id, ports); err != nil {
		return client.Sandbox{}, s.updateErr(id, err)
	}
	return s.Get(ctx, teamID, id)
}

// SetNetwork changes the network of the team's running sandbox: between
// outbound and rules, and the lists of rules, live. A sandbox created
// without network has no interface to open (409 conflict), and none is
// not a mode to move to. On error nothing changes.
func (s *Service) SetNetwork(ctx context.Context, teamID, id string, spec client.NetworkSpec) (client.Sandbox, error) {
	nw, err := parseNetwork(spec)
	if err != nil {
		return client.Sandbox{}, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.Sandbox{}, err
	}
	e.netMu.Lock()
	defer e.netMu.Unlock()
	row, err := s.Get(ctx, teamID, id)
	if err != nil {
		return client.Sandbox{}, err
	}
	if row.Network == client.NetworkNone {
		return client.Sandbox{}, errorf(client.CodeConflict,
			"sandbox %s was created with network none and has no interface to open; create it with mode rules (an empty allow list) to open it later", id)
	}
	if nw.mode == client.NetworkNone {
		return client.Sandbox{}, errorf(client.CodeConflict,
			"sandbox %s cannot lose its interface; use mode rules with an empty allow list to close it", id)
	}
	// Put the node back as the row says, when the update failed whole
	// (a node that answered with an error may have applied it all the
	// same: its answer was lost).
	restore := func() {
		old := (*nodeapi.Egress)(nil)
		if row.NetworkRules != nil {
			old = &nodeapi.Egress{Allow: row.NetworkRules.Allow, Deny: row.NetworkRules.Deny}
		}
		if rerr := s.node.SetEgress(context.WithoutCancel(ctx), id, old); rerr != nil {
			s.log.Error("restoring a sandbox's egress rules after a failed update", "sandbox", id, "err", rerr)
		}
	}
	if err := s.node.SetEgress(ctx, id, nw.egress); err != nil {
		if apierr.Code(err) == "" {
			restore()
		}
		return client.Sandbox{}, s.callErr(e, err)
	}
	if err := s.store.SetNetwork(ctx, teamID, id, nw.mode, nw.lists); err != nil {
		restore()
		return client.Sandbox{}, s.updateErr(id, err)
	}
	s.log.Info("sandbox network set", "sandbox", id, "team", teamID, "network", nw.mode,
		"allow", len(spec.Allow), "deny", len(spec.Deny))
	return s.Get(ctx, teamID, id)
}

// updateErr is the error of a store update of a sandbox that lookup found
// running.
func (s *Service) updateErr(id string, err error) error {
	switch {
	case errors.Is(err, store.ErrNotRunning):
		return errorf(client.CodeSandboxNotRunning, "sandbox %s is no longer running", id)
	case errors.Is(err, store.ErrNotFound):
		return errorf(client.CodeNotFound, "sandbox %s not found", id)
	}
	return fmt.Errorf("sandbox: %w", err)
}

// TrafficTokenFrom returns the traffic token a port request carries: the
// header, else the query parameter. It does not check it.
func TrafficTokenFrom(header, query string) string {
	return strings.TrimSpace(cmp.Or(header, query))
}
