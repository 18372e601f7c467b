package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/internal/runtime/network/networktest"
)

// restore restores a sandbox from dir, resumes its agent's session and
// registers its destruction (and the leftovers check) at cleanup.
func (e *testEnv) restore(t *testing.T, r *Runtime, id, netMode, dir string, nonce []byte) *sbx {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	rsb, err := r.Restore(ctx, runtime.Spec{
		ID: id, RootFS: e.rootfs, AgentPath: e.agent, AgentArgs: []string{"--workdir", "/", "--user", "root"},
		Env:      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		StateDir: t.TempDir(), CPU: 1, MemoryMB: 256, DiskMB: 64, Pids: 128, Network: netMode, Hostname: id,
	}, dir)
	if err != nil {
		t.Fatalf("Restore %s: %v", id, err)
	}
	s := &sbx{sb: rsb.(*sandbox)}
	t.Cleanup(func() {
		if s.agent != nil {
			s.agent.Close()
		}
		if err := s.sb.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy %s: %v", id, err)
		}
		if left := r.Leftovers(id); len(left) > 0 {
			t.Errorf("leftovers of %s after Destroy: %q", id, left)
		}
	})
	if s.agent, err = agentproto.Redial(rsb.Conn(), nonce); err != nil {
		t.Fatal(err)
	}
	if err := s.agent.Ping(ctx); err != nil {
		t.Fatalf("agent of restored %s: %v", id, err)
	}
	t.Logf("%s restored and answering in %v", id, time.Since(t0).Round(time.Millisecond))
	return s
}

// TestCheckpointRestore: a sandbox checkpointed with its session suspended
// goes on (its background process too) once resumed; two sandboxes
// restored from the image have its files and its running process, and
// are independent of it and of each other. A sandbox checkpointed without
// leave-running stops; restored under its own id again and again, it
// keeps what each run changed.
func TestCheckpointRestore(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	netm, err := network.New(network.Config{Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir(), netm: netm}
	r := e.runtime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	src := e.start(t, r, "gv-ck-src", runtime.NetworkNone)
	src.sh(t, "echo prepared > /root/state; mkdir -p /work")
	bg, err := src.agent.Start(ctx, agentproto.ExecRequest{Shell: "i=0; while :; do i=$((i+1)); echo $i > /work/count; sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	nonce := bytes.Repeat([]byte{3}, agentproto.NonceSize)
	if err := src.agent.Suspend(ctx, nonce); err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	t0 := time.Now()
	if err := src.sb.Checkpoint(ctx, img, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint (leave running) in %v", time.Since(t0).Round(time.Millisecond))
	if err := src.agent.Resume(nil); err != nil {
		t.Fatal(err)
	}
	counting := func(s *sbx, name string) {
		t.Helper()
		a := s.sh(t, "cat /work/count")
		time.Sleep(300 * time.Millisecond)
		if b := s.sh(t, "cat /work/count"); a == b {
			t.Errorf("%s: the background process does not count (%q)", name, a)
		}
	}
	counting(src, "source")

	f1 := e.restore(t, r, "gv-ck-f1", runtime.NetworkNone, img, nonce)
	f2 := e.restore(t, r, "gv-ck-f2", runtime.NetworkNone, img, nonce)
	for i, f := range []*sbx{f1, f2} {
		name := fmt.Sprintf("fork %d", i+1)
		if got := f.sh(t, "cat /root/state"); got != "prepared\n" {
			t.Errorf("%s: /root/state %q", name, got)
		}
		procs, err := f.agent.List(ctx)
		// The exec just run (cat) may still be listed, ended: the
		// restored processes are the running ones, and only the
		// background one is.
		procs = slices.DeleteFunc(procs, func(p agentproto.ProcInfo) bool { return !p.Running && p.ID != bg.ID })
		if err != nil || len(procs) != 1 || procs[0].ID != bg.ID || !procs[0].Running {
			t.Errorf("%s: processes %+v %v", name, procs, err)
		}
		counting(f, name)
		f.sh(t, fmt.Sprintf("echo %d > /root/mine", i+1))
	}
	for name, s := range map[string]*sbx{"source": src, "fork 1": f1, "fork 2": f2} {
		want := map[string]string{"source": "", "fork 1": "1", "fork 2": "2"}[name]
		if got := strings.TrimSpace(s.sh(t, "cat /root/mine 2>/dev/null")); got != want {
			t.Errorf("%s: /root/mine %q, want %q", name, got, want)
		}
	}
	// Killing the background process of one fork leaves the others'.
	if err := f1.agent.Signal(ctx, bg.ID, 9); err != nil {
		t.Fatal(err)
	}
	if exit, err := f1.agent.Wait(ctx, bg.ID); err != nil || exit.Status != agentproto.StatusKilled {
		t.Fatalf("fork 1's wait: %+v %v", exit, err)
	}
	counting(f2, "fork 2 after fork 1's kill")
	counting(src, "source after fork 1's kill")
}

// TestPauseResume: a sandbox checkpointed without leave-running and
// destroyed comes back under its own id from the image, with what it
// changed; paused and resumed again and again, it keeps each run's
// changes (E2B's "changes lost after the second resume"), and its
// background process goes on counting from where it was.
func TestPauseResume(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	netm, err := network.New(network.Config{Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir(), netm: netm}
	r := e.runtime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const id = "gv-pause"
	spec := runtime.Spec{
		ID: id, RootFS: e.rootfs, AgentPath: e.agent, AgentArgs: []string{"--workdir", "/", "--user", "root"},
		Env:      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		StateDir: t.TempDir(), CPU: 1, MemoryMB: 256, DiskMB: 64, Pids: 128, Network: runtime.NetworkNone, Hostname: id,
	}
	rsb, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	s := &sbx{sb: rsb.(*sandbox)}
	defer func() {
		s.agent.Close()
		if err := s.sb.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		if left := r.Leftovers(id); len(left) > 0 {
			t.Errorf("leftovers after Destroy: %q", left)
		}
	}()
	if s.agent, err = agentproto.Dial(rsb.Conn()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.agent.Start(ctx, agentproto.ExecRequest{Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"}); err != nil {
		t.Fatal(err)
	}
	last := 0
	for round := 1; round <= 3; round++ {
		s.sh(t, fmt.Sprintf("echo %d >> /root/rounds", round))
		var n int
		if _, err := fmt.Sscan(s.sh(t, "cat /tmp/count"), &n); err != nil || n <= last {
			t.Fatalf("round %d: count %d after %d (%v)", round, n, last, err)
		}
		last = n
		nonce := bytes.Repeat([]byte{byte(round)}, agentproto.NonceSize)
		if err := s.agent.Suspend(ctx, nonce); err != nil {
			t.Fatal(err)
		}
		img := t.TempDir()
		t0 := time.Now()
		if err := s.sb.Checkpoint(ctx, img, false); err != nil {
			t.Fatal(err)
		}
		s.agent.Close()
		if err := s.sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		if left := r.Leftovers(id); len(left) > 0 {
			t.Fatalf("round %d: a paused sandbox holds %q", round, left)
		}
		paused := time.Since(t0)
		t0 = time.Now()
		spec.StateDir = t.TempDir()
		if rsb, err = r.Restore(ctx, spec, img); err != nil {
			t.Fatalf("round %d: restore: %v", round, err)
		}
		s.sb = rsb.(*sandbox)
		if s.agent, err = agentproto.Redial(rsb.Conn(), nonce); err != nil {
			t.Fatal(err)
		}
		if err := s.agent.Ping(ctx); err != nil {
			t.Fatalf("round %d: agent after resume: %v", round, err)
		}
		t.Logf("round %d: paused in %v, resumed in %v", round, paused.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
		want := ""
		for i := 1; i <= round; i++ {
			want += fmt.Sprintf("%d\n", i)
		}
		if got := s.sh(t, "cat /root/rounds"); got != want {
			t.Fatalf("round %d: /root/rounds %q, want %q", round, got, want)
		}
	}
}

// TestCheckpointRestoreOutbound: a sandbox restored from an outbound one
// gets its own link and address, which its netstack takes over, and
// reaches the internet from there; the source keeps its own.
func TestCheckpointRestoreOutbound(t *testing.T) {
	runsc, agent, rootfs := testBinaries(t)
	inet := networktest.Setup(t)
	netm := networktest.Manager(t, network.Config{
		Scope: fmt.Sprintf("evalbox-gv-test-%d", os.Getpid()),
		Pool:  netip.MustParsePrefix("10.233.0.0/24"),
		DNS:   []netip.Addr{},
	})
	e := &testEnv{runsc: runsc, agent: agent, rootfs: rootfs, rootDir: t.TempDir(), netm: netm}
	r := e.runtime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inetAddr := fmt.Sprintf("%s:%d", inet.Server, inet.Port)

	src := e.start(t, r, "gv-ck-out", runtime.NetworkOutbound)
	if got := src.dial(t, inetAddr); !strings.HasPrefix(got, inet.Gateway.String()+":") {
		t.Fatalf("source before: %q", got)
	}
	nonce := bytes.Repeat([]byte{5}, agentproto.NonceSize)
	if err := src.agent.Suspend(ctx, nonce); err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	if err := src.sb.Checkpoint(ctx, img, true); err != nil {
		t.Fatal(err)
	}
	if err := src.agent.Resume(nil); err != nil {
		t.Fatal(err)
	}
	f := e.restore(t, r, "gv-ck-out-f", runtime.NetworkOutbound, img, nonce)
	ls, lf := src.sb.net.lease, f.sb.net.lease
	if ls.Prefix() == lf.Prefix() {
		t.Fatalf("fork shares %v with its source", ls.Prefix())
	}
	if out := f.sh(t, "hostname -I"); !strings.Contains(out, lf.GuestAddr().String()) || strings.Contains(out, ls.GuestAddr().String()) {
		t.Fatalf("fork's addresses %q, want %s only", out, lf.GuestAddr())
	}
	for name, s := range map[string]*sbx{"source": src, "fork": f} {
		if got := s.dial(t, inetAddr); !strings.HasPrefix(got, inet.Gateway.String()+":") {
			t.Errorf("%s after the checkpoint: internet %q", name, got)
		}
	}
}
