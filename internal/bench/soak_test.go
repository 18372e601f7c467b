package bench

import "testing"

func TestGrowthOf(t *testing.T) {
	// RSS swinging with the garbage collector around a floor that rises by
	// 10 after warm-up; fds flat but for one spike.
	var ss []serverSample
	for i := 1; i <= 100; i++ {
		rss := 50.0 + float64(i%3)*20
		if i > 60 {
			rss += 10
		}
		fds := 18.0
		if i == 99 {
			fds = 40
		}
		ss = append(ss, serverSample{cycles: i, rss: rss, fds: fds})
	}
	rss, fds, from := growthOf(ss, 20)
	if from != 20 || rss.Warm != 50 || rss.End != 60 || rss.Delta != 10 || fds.Delta != 0 {
		t.Errorf("growthOf = %+v, %+v, from %d", rss, fds, from)
	}
	// Shorter than the warm-up: from the first sample.
	if rss, _, from := growthOf(ss[:15], 20); from != 0 || rss.Warm != 50 {
		t.Errorf("short run: %+v from %d", rss, from)
	}
	if rss, fds, _ := growthOf(nil, 20); rss != (growth{}) || fds != (growth{}) {
		t.Errorf("no samples: %+v %+v", rss, fds)
	}
}

func TestIsChainRuleDiff(t *testing.T) {
	for line, want := range map[string]bool{
		"iptables rules: gone: filter: -A EVALBOX-FWD ! -s 10.200.0.0/16 -i evb+ -j DROP":    true,
		"iptables rules: left: nat: -A EVALBOX-NAT -s 10.231.0.0/24 ! -o evb+ -j MASQUERADE": true,
		"iptables rules: left: filter: -A FORWARD -j EVALBOX-FWD":                            false,
		"iptables rules: left: filter: -A EVALBOX-FWD -i evb7 -j ACCEPT":                     false,
		"cgroups: left: /sys/fs/cgroup/cpu/evalbox-gv-1/sb-a":                                false,
	} {
		if got := isChainRuleDiff(line); got != want {
			t.Errorf("isChainRuleDiff(%q) = %v", line, got)
		}
	}
}
