package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

// egressNode is a fake node that records SetEgress calls and fails the
// ones asked to.
type egressNode struct {
	*fakeNode
	mu    sync.Mutex
	calls []*nodeapi.Egress
	fail  error
}

func (n *egressNode) SetEgress(ctx context.Context, id string, e *nodeapi.Egress) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fail != nil {
		return n.fail
	}
	n.calls = append(n.calls, e)
	return nil
}

// TestCreateNetwork: the network of a create, checked at the edge, goes to
// the node as a pool class (rules sandboxes are outbound ones) and egress
// rules, and the row says what was asked.
func TestCreateNetwork(t *testing.T) {
	f := newFakeNode()
	svc, _ := newTestService(t, f)
	ctx := context.Background()
	sb, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base",
		Network: client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"pypi.org", "10.1.0.0/16"}}})
	if err != nil {
		t.Fatal(err)
	}
	req := f.creates[len(f.creates)-1]
	if req.Spec.Shape.Network != client.NetworkOutbound || req.Egress == nil || !slices.Equal(req.Egress.Allow, []string{"pypi.org", "10.1.0.0/16"}) {
		t.Errorf("node request: shape %q egress %+v", req.Spec.Shape.Network, req.Egress)
	}
	if sb.Network != client.NetworkRules || sb.NetworkRules == nil || len(sb.NetworkRules.Deny) != 0 || sb.NetworkRules.Deny == nil {
		t.Errorf("row: %s %+v", sb.Network, sb.NetworkRules)
	}
	if !strings.HasPrefix(sb.TrafficToken, trafficTokenPrefix) || sb.TrafficTokenHash != hashTrafficToken(sb.TrafficToken) {
		t.Errorf("token %q hash %q", sb.TrafficToken, sb.TrafficTokenHash)
	}
	if got, _ := svc.Get(ctx, "team", sb.ID); got.TrafficToken != "" {
		t.Error("the token is kept past the create")
	}
	for _, bad := range []struct {
		req client.CreateSandboxRequest
		msg string
	}{
		{client.CreateSandboxRequest{Network: client.NetworkSpec{Mode: client.NetworkRules, Deny: []string{"ok.org", "*bad"}}}, `network.deny[1]: "*bad"`},
		{client.CreateSandboxRequest{Network: client.NetworkSpec{Mode: "wide"}}, "network.mode"},
		{client.CreateSandboxRequest{Network: client.NetworkSpec{Allow: []string{"x.org"}}}, "need mode"},
		{client.CreateSandboxRequest{Ports: []client.PortSpec{{Port: 80}, {Port: 80, Public: true}}}, "ports[1]: port 80 is listed twice"},
		{client.CreateSandboxRequest{Ports: []client.PortSpec{{Port: 70000}}}, "ports[0]"},
	} {
		bad.req.Template = "base"
		n := len(f.creates)
		if _, err := svc.Create(ctx, "team", bad.req); apierr.Code(err) != client.CodeBadRequest || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("%+v: %v, want a 400 with %q", bad.req, err, bad.msg)
		}
		if len(f.creates) != n {
			t.Errorf("%+v reached the node", bad.req)
		}
	}
}

// TestCreateNetworkOnAnOldNode: a node that does not apply egress rules
// (it predates them) gets its sandbox destroyed, and the create fails.
func TestCreateNetworkOnAnOldNode(t *testing.T) {
	f := newFakeNode()
	f.ignoresEgress = true
	svc, _ := newTestService(t, f)
	_, err := svc.Create(context.Background(), "team", client.CreateSandboxRequest{Template: "base",
		Network: client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"pypi.org"}}})
	if apierr.Code(err) != client.CodeUnavailable || !strings.Contains(err.Error(), "does not apply network rules") {
		t.Fatalf("create on an old node: %v", err)
	}
	if !f.isDestroyed("sb-1") {
		t.Error("the sandbox of the old node was left running")
	}
	if _, err := svc.Create(context.Background(), "team", client.CreateSandboxRequest{Template: "base", Network: client.Network(client.NetworkOutbound)}); err != nil {
		t.Errorf("outbound on an old node: %v", err)
	}
}

// TestSetNetwork: updates go to the node, then the row; one that fails
// changes neither (the node is put back when the row cannot be written).
func TestSetNetwork(t *testing.T) {
	n := &egressNode{fakeNode: newFakeNode()}
	svc, st := newTestService(t, n)
	ctx := context.Background()
	sb, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base", Network: client.Network(client.NetworkOutbound)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := svc.SetNetwork(ctx, "team", sb.ID, client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"pypi.org"}})
	if err != nil || got.Network != client.NetworkRules || !slices.Equal(got.NetworkRules.Allow, []string{"pypi.org"}) {
		t.Fatalf("set rules: %+v, %v", got, err)
	}
	if len(n.calls) != 1 || n.calls[0] == nil || n.calls[0].Allow[0] != "pypi.org" {
		t.Errorf("node calls %+v", n.calls)
	}
	// Bad rules: a 400, and nothing reaches the node.
	if _, err := svc.SetNetwork(ctx, "team", sb.ID, client.NetworkSpec{Mode: client.NetworkRules, Allow: []string{"300.1.1.1/32"}}); apierr.Code(err) != client.CodeBadRequest {
		t.Errorf("bad rules: %v", err)
	}
	// The node refuses: the row stays.
	n.fail = errors.New("iptables broke")
	if _, err := svc.SetNetwork(ctx, "team", sb.ID, client.Network(client.NetworkOutbound)); err == nil {
		t.Error("a failed node update succeeded")
	}
	if r := st.Row(sb.ID); r.Network != client.NetworkRules || r.NetworkRules.Allow[0] != "pypi.org" {
		t.Errorf("row after a failed update: %s %+v", r.Network, r.NetworkRules)
	}
	n.fail = nil
	if len(n.calls) != 1 {
		t.Errorf("node calls %+v", n.calls)
	}
	// Back to outbound: the node gets no rules.
	if got, err := svc.SetNetwork(ctx, "team", sb.ID, client.Network(client.NetworkOutbound)); err != nil || got.Network != client.NetworkOutbound || got.NetworkRules != nil {
		t.Errorf("to outbound: %+v, %v", got, err)
	}
	if len(n.calls) != 2 || n.calls[1] != nil {
		t.Errorf("node calls %+v", n.calls)
	}
	// Another team's sandbox is not found; none is not a mode to move to.
	if _, err := svc.SetNetwork(ctx, "other", sb.ID, client.Network(client.NetworkOutbound)); apierr.Code(err) != client.CodeNotFound {
		t.Errorf("another team: %v", err)
	}
	if _, err := svc.SetNetwork(ctx, "team", sb.ID, client.Network(client.NetworkNone)); apierr.Code(err) != client.CodeConflict {
		t.Errorf("to none: %v", err)
	}
}

// TestPortAccess: a public port opens to anyone, the traffic token opens
// every port of its sandbox only, until rotated.
func TestPortAccess(t *testing.T) {
	svc, _ := newTestService(t, newFakeNode())
	ctx := context.Background()
	a, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base", Ports: []client.PortSpec{{Port: 8000, Public: true}, {Port: 9000}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := svc.Create(ctx, "team", client.CreateSandboxRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(id string, port int, token string, want bool) {
		t.Helper()
		acc, err := svc.PortAccess(ctx, id, port, token)
		if err != nil || acc.Allowed != want || acc.TeamID != "team" {
			t.Errorf("access %s:%d token %.8q = %+v, %v; want allowed %v", id, port, token, acc, err, want)
		}
	}
	check(a.ID, 8000, "", true)
	check(a.ID, 9000, "", false)
	check(a.ID, 9000, a.TrafficToken, true)
	check(a.ID, 9000, b.TrafficToken, false)
	check(b.ID, 8000, a.TrafficToken, false)
	if _, err := svc.PortAccess(ctx, "sb-nope", 80, a.TrafficToken); apierr.Code(err) != client.CodeNotFound {
		t.Errorf("unknown sandbox: %v", err)
	}
	tok, err := svc.RotateTrafficToken(ctx, "team", a.ID)
	if err != nil || tok == a.TrafficToken {
		t.Fatalf("rotate: %q, %v", tok, err)
	}
	check(a.ID, 9000, a.TrafficToken, false)
	check(a.ID, 9000, tok, true)
	if _, err := svc.RotateTrafficToken(ctx, "other", a.ID); apierr.Code(err) != client.CodeNotFound {
		t.Errorf("rotate another team's: %v", err)
	}
	if _, err := svc.SetPorts(ctx, "team", a.ID, nil); err != nil {
		t.Fatal(err)
	}
	check(a.ID, 8000, "", false)
}
