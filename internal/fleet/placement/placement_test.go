package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/evalbox/evalbox/internal/nodeapi"
)

const gib = 1 << 30

func node(id string, freeGiB int64, opts ...func(*Node)) Node {
	n := Node{ID: id, Runtimes: []string{"gvisor", "namespaces"},
		Budget: nodeapi.Resources{Pids: 100_000, MemoryBytes: 64 * gib},
		Free:   nodeapi.Resources{Pids: 100_000, MemoryBytes: freeGiB * gib}}
	for _, o := range opts {
		o(&n)
	}
	return n
}

func warm(n *Node)           { n.WarmPool = true }
func withTemplate(n *Node)   { n.Templates = []string{"sha256:t"} }
func onlyNamespaces(n *Node) { n.Runtimes = []string{"namespaces"} }
func placed(gb int64) func(*Node) {
	return func(n *Node) { n.Placed.MemoryBytes = gb * gib }
}

func TestPlace(t *testing.T) {
	req := Request{Runtime: "gvisor", Template: "sha256:t", Shape: nodeapi.Shape{MemoryMB: 512, DiskMB: 512, Pids: 1024}}
	for _, tc := range []struct {
		name  string
		nodes []Node
		req   Request
		n     int
		want  []string // exact order; nil: none
	}{
		{"none", nil, req, 3, nil},
		{"no runtime", []Node{node("a", 10, onlyNamespaces)}, req, 3, nil},
		{"no room", []Node{node("a", 1)}, req, 3, nil}, // 512+512+96 MiB > 1 GiB
		{"room only after placed", []Node{node("a", 2, placed(1))}, req, 3, nil},
		{"one", []Node{node("a", 2)}, req, 3, []string{"a"}},
		{"warm before template before any",
			[]Node{node("any", 60), node("tpl", 30, withTemplate), node("warm", 2, warm)}, req, 3,
			[]string{"warm", "tpl", "any"}},
		{"template before emptier",
			[]Node{node("any", 60), node("tpl", 3, withTemplate)}, req, 1, []string{"tpl"}},
		{"best of two by free", []Node{node("full", 5), node("empty", 50)}, req, 2, []string{"empty", "full"}},
		{"placed counts", []Node{node("a", 50, placed(48)), node("b", 10)}, req, 2, []string{"b", "a"}},
		{"at most n", []Node{node("a", 10), node("b", 20), node("c", 30)}, req, 1, nil /* any one */},
		{"namespaces cost is its memory", []Node{node("a", 1, onlyNamespaces)},
			Request{Runtime: "namespaces", Shape: nodeapi.Shape{MemoryMB: 1024, Pids: 1024}}, 1, []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Place(tc.nodes, tc.req, rand.New(rand.NewPCG(1, 2)), tc.n)
			if tc.name == "at most n" {
				if len(got) != 1 {
					t.Fatalf("got %v, want one node", got)
				}
				return
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPlaceSpreads: best of two random picks spreads sandboxes over equal
// nodes, and never picks the fullest of three when the others have room.
func TestPlaceSpreads(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	nodes := []Node{node("a", 8), node("b", 8), node("c", 8)}
	req := Request{Runtime: "namespaces", Shape: nodeapi.Shape{MemoryMB: 64, Pids: 64}}
	count := map[string]int{}
	for range 300 {
		id := Place(nodes, req, rnd, 1)[0]
		count[id]++
		for i := range nodes {
			if nodes[i].ID == id {
				nodes[i].Placed.MemoryBytes += req.Cost().MemoryBytes
				nodes[i].Placed.Pids += req.Cost().Pids
			}
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		if count[id] < 90 || count[id] > 110 {
			t.Errorf("spread %v: node %s far from 100", count, id)
		}
	}
}

func TestPlaceDistinct(t *testing.T) {
	var nodes []Node
	for i := range 10 {
		nodes = append(nodes, node(fmt.Sprint(i), int64(2+i)))
	}
	got := Place(nodes, Request{Runtime: "gvisor", Shape: nodeapi.Shape{MemoryMB: 256, Pids: 64}}, rand.New(rand.NewPCG(5, 6)), 10)
	if len(got) != 10 {
		t.Fatalf("got %d nodes, want 10", len(got))
	}
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			t.Fatalf("node %s returned twice: %v", id, got)
		}
		seen[id] = true
	}
}

// BenchmarkPlace is the placement decision time over 1,000 live nodes (3
// choices: the retry list of a create).
func BenchmarkPlace(b *testing.B) {
	rnd := rand.New(rand.NewPCG(7, 8))
	nodes := make([]Node, 1000)
	for i := range nodes {
		nodes[i] = node(fmt.Sprintf("node-%04d", i), 4+int64(i%60))
		if i%3 == 0 {
			nodes[i].Templates = []string{"sha256:t"}
		}
	}
	req := Request{Runtime: "gvisor", Template: "sha256:t", Shape: nodeapi.Shape{MemoryMB: 512, DiskMB: 512, Pids: 1024}}
	b.ReportAllocs()
	for b.Loop() {
		if len(Place(nodes, req, rnd, 3)) != 3 {
			b.Fatal("no placement")
		}
	}
}
