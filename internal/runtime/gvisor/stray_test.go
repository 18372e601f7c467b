package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/runtime/network"
)

func TestMain(m *testing.M) {
	// TestSweepEndsStrayRunsc runs this binary as a stand-in for a runsc
	// command in flight (its argv[0] ends in runsc): it waits to be killed.
	if filepath.Base(os.Args[0]) == "runsc" {
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSweepEndsStrayRunsc: the runsc commands of the driver's root that
// are not its own and serve no live container — those of a server on the
// same data dir that was killed with a `runsc run` in flight, which goes
// on making its container after the server is gone — are ended by Sweep
// before it looks for containers (else such a container appeared after
// the sweep of the restarted server and stayed until the next one). Those
// of kept containers and of other roots are left alone.
func TestSweepEndsStrayRunsc(t *testing.T) {
	runsc, agent, _ := testBinaries(t)
	netm, err := network.New(network.Config{Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{runsc: runsc, agent: agent, rootDir: t.TempDir(), netm: netm}
	r := e.runtime(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.Symlink(exe, fake); err != nil {
		t.Fatal(err)
	}
	otherRoot := t.TempDir()
	// stray starts a stand-in `runsc --root root run --detach id` through
	// a shell that exits at once: nobody's child here, as a dead server's
	// command is.
	stray := func(root, id string) int {
		out, err := exec.Command("sh", "-c", `"$0" --root "$1" run --detach "$2" </dev/null >/dev/null 2>&1 & echo $!`, fake, root, id).Output()
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(b), "--root") && ppidOf(pid) != os.Getpid() {
				return pid
			}
			if time.Now().After(deadline) {
				t.Fatalf("stand-in %d never ran", pid)
			}
		}
	}
	alive := func(pid int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && !strings.HasPrefix(string(b[i+1:]), " Z")
	}
	orphan := stray(e.rootDir, "sb-stray")
	kept := stray(e.rootDir, "sb-kept")
	other := stray(otherRoot, "sb-other")
	if _, err := r.Sweep(context.Background(), func(id string) bool { return id == "sb-kept" }); err != nil {
		t.Fatal(err)
	}
	if alive(orphan) {
		t.Errorf("the stray runsc command %d outlived the sweep", orphan)
	}
	if !alive(kept) || !alive(other) {
		t.Errorf("the sweep ended a kept container's runsc (%v) or another root's (%v)", alive(kept), alive(other))
	}
}
