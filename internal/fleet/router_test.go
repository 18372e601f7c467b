package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/fleet/membership"
	"github.com/evalbox/evalbox/internal/nodeapi"
)

// fakeNode is a node whose sandboxes are names; calls the tests do not use
// are those of the nil interface it embeds.
type fakeNode struct {
	nodeapi.Node
	id string

	mu        sync.Mutex
	n         int
	createErr error
	sandboxes map[string]bool
	block     chan struct{} // Exec and Wait block on it (or their ctx)
}

func (f *fakeNode) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.createErr != nil {
		return nodeapi.SandboxInfo{}, f.createErr
	}
	f.n++
	id := fmt.Sprintf("%s-sb%d", f.id, f.n)
	f.sandboxes[id] = true
	return nodeapi.SandboxInfo{ID: id, Runtime: req.Spec.Runtime}, nil
}

func (f *fakeNode) has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id]
}

func (f *fakeNode) Destroy(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, id)
	return nil
}

func (f *fakeNode) Exec(ctx context.Context, id string, req nodeapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	if !f.has(id) {
		return nodeapi.ExitInfo{}, nodeapi.ErrSandboxNotFound
	}
	select {
	case <-f.block:
		return nodeapi.ExitInfo{Status: nodeapi.StatusExited}, nil
	case <-ctx.Done():
		return nodeapi.ExitInfo{}, fmt.Errorf("fake exec: %w: %w", nodeapi.ErrNodeUnreachable, ctx.Err())
	}
}

func (f *fakeNode) Wait(ctx context.Context, id string) (nodeapi.End, error) {
	<-ctx.Done()
	return nodeapi.End{}, ctx.Err()
}

func (f *fakeNode) Capacity(ctx context.Context) (nodeapi.CapacityStatus, error) {
	return nodeapi.CapacityStatus{Budget: nodeapi.Resources{Pids: 1000, MemoryBytes: 8 << 30}, Sandboxes: f.n}, nil
}

type fleetTest struct {
	t      *testing.T
	router *Router
	nodes  map[string]*fakeNode
	lost   chan string
	lookup map[string]string
}

func newFleet(t *testing.T, ids ...string) *fleetTest {
	ft := &fleetTest{t: t, nodes: map[string]*fakeNode{}, lost: make(chan string, 10), lookup: map[string]string{}}
	for _, id := range ids {
		ft.nodes[id] = &fakeNode{id: id, sandboxes: map[string]bool{}, block: make(chan struct{})}
	}
	ft.router = New(Config{
		Dial: func(n membership.Node) (nodeapi.Node, io.Closer, error) {
			f := ft.nodes[n.ID]
			if f == nil {
				return nil, nil, errors.New("no such node")
			}
			return f, io.NopCloser(nil), nil
		},
		Lookup: func(ctx context.Context, id string) (string, error) {
			if n, ok := ft.lookup[id]; ok {
				return n, nil
			}
			return "", nodeapi.ErrSandboxNotFound
		},
		OnNodeLost: func(id, reason string) { ft.lost <- reason },
		Rand:       rand.New(rand.NewPCG(1, 1)),
		Logger:     slog.New(slog.DiscardHandler),
	})
	for _, id := range ids {
		ft.router.HandleEvent(membership.Event{Type: membership.NodeAdded, Node: leaseNode(id, 4096)})
	}
	return ft
}

func leaseNode(id string, freeMB int64) membership.Node {
	return membership.Node{ID: id, Address: id + ":7070", LeaseDuration: 15 * time.Second, Expires: time.Now().Add(15 * time.Second),
		Capacity: membership.Capacity{MemoryMB: 8192, Pids: 100_000, Free: membership.Resources{MemoryMB: freeMB, Pids: 100_000},
			Runtimes: []string{"namespaces"}}}
}

var req = nodeapi.CreateRequest{Spec: nodeapi.Spec{Template: "sha256:t", Runtime: "namespaces", Shape: nodeapi.Shape{MemoryMB: 256, Pids: 64}}}

func (ft *fleetTest) create() nodeapi.SandboxInfo {
	ft.t.Helper()
	info, err := ft.router.Create(ft.t.Context(), req)
	if err != nil {
		ft.t.Fatal(err)
	}
	return info
}

// TestCreateSpreads: what this replica placed counts against a node until
// its Lease is written again, so creates between two Lease writes spread.
func TestCreateSpreads(t *testing.T) {
	ft := newFleet(t, "a", "b", "c")
	count := map[string]int{}
	for range 30 {
		info := ft.create()
		count[info.Node]++
		if !ft.nodes[info.Node].has(info.ID) {
			t.Fatalf("%s is not on node %s", info.ID, info.Node)
		}
	}
	for id, n := range count {
		if n < 7 || n > 13 {
			t.Errorf("spread %v: node %s far from 10", count, id)
		}
	}
	// 4 GiB free per node holds 16 sandboxes of 256 MiB: 48 in all, and
	// then no more until a Lease says there is room.
	for range 18 {
		ft.create()
	}
	if _, err := ft.router.Create(t.Context(), req); !errors.Is(err, nodeapi.ErrInsufficientCapacity) {
		t.Fatalf("a create past every node's room: %v", err)
	}
}

// TestCreateTriesAnother: a node that refuses (capacity, unreachable,
// template missing) is dropped and the next tried, up to 3 nodes.
func TestCreateTriesAnother(t *testing.T) {
	ft := newFleet(t, "a", "b", "c", "d")
	ft.nodes["a"].createErr = &nodeapi.CapacityError{Resource: "memory"}
	ft.nodes["b"].createErr = fmt.Errorf("x: %w", nodeapi.ErrNodeUnreachable)
	ft.nodes["c"].createErr = &nodeapi.TemplateMissingError{Digest: "sha256:t"}
	okCount := 0
	for range 20 {
		info, err := ft.router.Create(t.Context(), req)
		if err == nil {
			if info.Node != "d" {
				t.Fatalf("placed on %s, which refuses", info.Node)
			}
			okCount++
			continue
		}
		// d was not among the 3 tried.
		if !errors.Is(err, nodeapi.ErrInsufficientCapacity) && !errors.Is(err, nodeapi.ErrNodeUnreachable) && !errors.Is(err, nodeapi.ErrTemplateMissing) {
			t.Fatalf("create: %v", err)
		}
	}
	if okCount == 0 {
		t.Fatal("no create reached the one node that accepts")
	}
	// Another error is final.
	ft.nodes["d"].createErr = errors.New("runsc failed")
	for _, id := range []string{"a", "b", "c"} {
		ft.router.HandleEvent(membership.Event{Type: membership.NodeLeft, Node: leaseNode(id, 0)})
	}
	if _, err := ft.router.Create(t.Context(), req); err == nil || err.Error() != "runsc failed" {
		t.Fatalf("create: %v, want the node's own error", err)
	}
}

// TestNodeLoss: a lost node's calls in flight fail with NodeLostError, as
// do later ones and Wait; the other nodes' sandboxes are untouched.
func TestNodeLoss(t *testing.T) {
	ft := newFleet(t, "a", "b")
	var onA, onB nodeapi.SandboxInfo
	for onA.ID == "" || onB.ID == "" {
		info := ft.create()
		if info.Node == "a" {
			onA = info
		} else {
			onB = info
		}
	}
	errc := make(chan error, 2)
	go func() {
		_, err := ft.router.Exec(t.Context(), onA.ID, nodeapi.ExecRequest{}, nil, nil, nil)
		errc <- err
	}()
	waitc := make(chan nodeapi.End, 1)
	go func() {
		end, err := ft.router.Wait(t.Context(), onA.ID)
		errc <- err
		waitc <- end
	}()
	time.Sleep(20 * time.Millisecond)
	ft.router.HandleEvent(membership.Event{Type: membership.NodeExpired, Node: leaseNode("a", 0)})
	for range 2 {
		err := <-errc
		var lost *nodeapi.NodeLostError
		if !errors.As(err, &lost) || lost.NodeID != "a" || errors.Is(err, nodeapi.ErrSandboxStopped) {
			t.Fatalf("in flight on a lost node: %v", err)
		}
	}
	if end := <-waitc; end.Reason != "node a lost (its lease expired)" {
		t.Errorf("Wait's end: %q", end.Reason)
	}
	if reason := <-ft.lost; reason != "node a lost (its lease expired)" {
		t.Errorf("OnNodeLost: %q", reason)
	}
	if _, err := ft.router.Stat(t.Context(), onA.ID, "/"); !errors.Is(err, nodeapi.ErrNodeLost) {
		t.Errorf("a later call: %v", err)
	}
	if err := ft.router.Destroy(t.Context(), onA.ID); err != nil {
		t.Errorf("destroying a lost node's sandbox: %v", err)
	}
	close(ft.nodes["b"].block)
	if _, err := ft.router.Exec(t.Context(), onB.ID, nodeapi.ExecRequest{}, nil, nil, nil); err != nil {
		t.Errorf("another node's sandbox: %v", err)
	}
	for range 5 {
		if info := ft.create(); info.Node != "b" {
			t.Fatalf("placed on %s after it was lost", info.Node)
		}
	}
	// A new incarnation of a node loses the old one's sandboxes.
	ft.router.HandleEvent(membership.Event{Type: membership.NodeAdded, Node: leaseNode("b", 4096)})
	if _, err := ft.router.Exec(t.Context(), onB.ID, nodeapi.ExecRequest{}, nil, nil, nil); !errors.Is(err, nodeapi.ErrNodeLost) {
		t.Errorf("a sandbox of a node's previous incarnation: %v", err)
	}
}

// TestLookup: a sandbox this Router did not create goes to the node its
// row names; one of a node that is not live is lost.
func TestLookup(t *testing.T) {
	ft := newFleet(t, "a")
	ft.nodes["a"].sandboxes["other"] = true
	ft.lookup["other"], ft.lookup["gone"] = "a", "z"
	close(ft.nodes["a"].block)
	if _, err := ft.router.Exec(t.Context(), "other", nodeapi.ExecRequest{}, nil, nil, nil); err != nil {
		t.Errorf("exec by lookup: %v", err)
	}
	if _, err := ft.router.Exec(t.Context(), "gone", nodeapi.ExecRequest{}, nil, nil, nil); !errors.Is(err, nodeapi.ErrNodeLost) {
		t.Errorf("exec on a node that is not live: %v", err)
	}
	if _, err := ft.router.Exec(t.Context(), "nope", nodeapi.ExecRequest{}, nil, nil, nil); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
		t.Errorf("exec of an unknown sandbox: %v", err)
	}
}

func TestAggregates(t *testing.T) {
	ft := newFleet(t, "a", "b")
	rts, _ := ft.router.Runtimes(t.Context())
	if len(rts) != 1 || rts[0] != "namespaces" {
		t.Errorf("runtimes %v", rts)
	}
	c, err := ft.router.Capacity(t.Context())
	if err != nil || c.Budget.Pids != 2000 || c.Budget.MemoryBytes != 16<<30 {
		t.Errorf("capacity %+v, %v", c, err)
	}
}
