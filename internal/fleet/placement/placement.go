// Package placement chooses the node a new sandbox goes to: a pure function
// of a snapshot of the live nodes and the request, so that it can be tested
// by table and benchmarked on its own (docs/design/fleet.md, "Placement").
//
// Candidates are the nodes that run the request's runtime and whose free
// capacity (from their Lease, less what this replica placed on them since
// the Lease was written) covers the sandbox's host cost (nodeapi.HostCost,
// the formula the nodes admit with). They are preferred in groups: a warm
// pool of the request's spec, then the template present, then any. Within
// the first group that has candidates, the choice is the better of K = 2
// picked at random, by free capacity (the power of two choices: near-best
// spread, without every replica picking the same emptiest node at once).
package placement

import (
	"math/rand/v2"
	"slices"

	"github.com/evalbox/evalbox/internal/nodeapi"
)

// K is how many random candidates a choice compares.
const K = 2

// Node is a live node as placement sees it.
type Node struct {
	ID       string
	Runtimes []string
	// Budget and Free are the node's budgets and what is left of them,
	// from its Lease.
	Budget, Free nodeapi.Resources
	// Placed is what this replica placed on the node since its Lease was
	// written (creates the Lease's Free does not count yet).
	Placed nodeapi.Resources
	// Templates are the digests of the templates the node holds.
	Templates []string
	// WarmPool is set when the node keeps a warm pool of the request's
	// spec (the caller knows which pools it set).
	WarmPool bool
}

// Request is what a sandbox needs of a node.
type Request struct {
	Runtime string
	// Template is the template's digest.
	Template string
	Shape    nodeapi.Shape
}

// Cost is the request's host cost on a node.
func (r Request) Cost() nodeapi.Resources { return nodeapi.HostCost(r.Runtime, r.Shape) }

// Preference groups, best first.
const (
	prefWarm = iota
	prefTemplate
	prefAny
	nPrefs
)

// Place returns up to n node ids for req, in the order to try them: each is
// the choice among the nodes not returned before it (a node that refuses is
// dropped and the next tried). Nothing is returned when no node runs the
// runtime with room for the sandbox. rnd makes the random picks (seed it in
// tests); Place does not keep nodes.
func Place(nodes []Node, req Request, rnd *rand.Rand, n int) []string {
	cost := req.Cost()
	var groups [nPrefs][]int // indexes into nodes
	for i := range nodes {
		nd := &nodes[i]
		if !slices.Contains(nd.Runtimes, req.Runtime) || !fits(free(nd), cost) {
			continue
		}
		p := prefAny
		switch {
		case nd.WarmPool:
			p = prefWarm
		case req.Template != "" && slices.Contains(nd.Templates, req.Template):
			p = prefTemplate
		}
		groups[p] = append(groups[p], i)
	}
	var out []string
	for g := 0; g < nPrefs && len(out) < n; g++ {
		cands := groups[g]
		for len(cands) > 0 && len(out) < n {
			best := pick(nodes, cands, cost, rnd)
			out = append(out, nodes[cands[best]].ID)
			cands[best] = cands[len(cands)-1]
			cands = cands[:len(cands)-1]
		}
	}
	return out
}

// pick returns the index into cands of the better of K random candidates.
func pick(nodes []Node, cands []int, cost nodeapi.Resources, rnd *rand.Rand) int {
	if len(cands) == 1 {
		return 0
	}
	best := rnd.IntN(len(cands))
	for range K - 1 {
		c := rnd.IntN(len(cands) - 1)
		if c >= best {
			c++ // a second, distinct candidate
		}
		if score(&nodes[cands[c]], cost) > score(&nodes[cands[best]], cost) {
			best = c
		}
	}
	return best
}

// free is what a node has left, less what this replica placed on it.
func free(n *Node) nodeapi.Resources {
	return nodeapi.Resources{Pids: n.Free.Pids - n.Placed.Pids, MemoryBytes: n.Free.MemoryBytes - n.Placed.MemoryBytes}
}

func fits(free, cost nodeapi.Resources) bool {
	return free.Pids >= cost.Pids && free.MemoryBytes >= cost.MemoryBytes
}

// score is the share of the node's scarcer budget left after the sandbox:
// nodes of different sizes compare by how full they would be.
func score(n *Node, cost nodeapi.Resources) float64 {
	f := free(n)
	share := func(free, need, budget int64) float64 {
		if budget <= 0 {
			return 0
		}
		return float64(free-need) / float64(budget)
	}
	return min(share(f.Pids, cost.Pids, n.Budget.Pids), share(f.MemoryBytes, cost.MemoryBytes, n.Budget.MemoryBytes))
}
