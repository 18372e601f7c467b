package agent

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads in /proc/self/status")
	return 0
}

// TestKeepSpareThreads: the threads are made at once (idle ones the
// process had count) and stay: the Go runtime keeps idle threads, ready
// for its later needs.
func TestKeepSpareThreads(t *testing.T) {
	before := threads(t)
	KeepSpareThreads(24)
	time.Sleep(100 * time.Millisecond)
	if after := threads(t); after < 24 || after < before {
		t.Fatalf("threads: %d before, %d after KeepSpareThreads(24)", before, after)
	}
}
