package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestHostile runs code that tries to harm the host or escape, on every
// runtime. Each case must end with a clear status; the server must stay
// healthy; nothing of the sandbox may remain after delete.
func TestHostile(t *testing.T) {
	canaryDir := t.TempDir()
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	canary := filepath.Join(canaryDir, "canary.txt")
	if err := os.WriteFile(canary, []byte(hex.EncodeToString(secret)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c := defaultTeam(t)
			healthy := func(t *testing.T) {
				t.Helper()
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
				if r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo ok"}); r.Stdout != "ok\n" {
					t.Fatalf("server unhealthy after hostile case: %+v", r)
				}
			}
			// stillOrLost accepts a sandbox that survived, or one that was
			// recorded as lost (and so cleaned up) — never a hang.
			t.Run("fork_bomb", func(t *testing.T) {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
				r, err := c.Exec(ctxT(t, 2*time.Minute), sb.ID, client.ExecRequest{Timeout: 5, Cmd: `bomb() { bomb | bomb & }; bomb; sleep 10`})
				if err == nil && r.Status != client.StatusTimedOut && r.Status != client.StatusExited {
					t.Fatalf("fork bomb: %+v", r)
				}
				if err != nil && !client.IsSandboxNotRunning(err) {
					t.Fatalf("fork bomb: %v", err)
				}
				healthy(t)
			})
			t.Run("memory_hog", func(t *testing.T) {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt, MemoryMB: 128})
				r, err := c.Exec(ctxT(t, 2*time.Minute), sb.ID, client.ExecRequest{Timeout: 60, Cmd: `head -c 2000000000 /dev/zero | tail -c 1900000000 >/dev/null`})
				switch {
				case err != nil && client.IsSandboxNotRunning(err):
					// gVisor: the OOM killer takes the Sentry, and so the sandbox.
					got, _ := c.GetSandbox(context.Background(), sb.ID)
					if got.State != client.StateLost || !strings.Contains(got.EndReason, "out of memory") {
						t.Fatalf("sandbox after OOM: %+v", got)
					}
					assertGone(t, srv, sb.ID)
				case err != nil:
					t.Fatalf("memory hog: %v", err)
				case r.ExitCode == 0 || !strings.Contains(r.Error, "out-of-memory"):
					t.Fatalf("memory hog was not stopped with a clear status: %+v", r)
				}
				healthy(t)
			})
			t.Run("disk_limit", func(t *testing.T) {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt, DiskMB: 64})
				r := mustExec(t, c, sb.ID, client.ExecRequest{Timeout: 60, Cmd: `dd if=/dev/zero of=/work/big bs=1M count=400 2>&1; echo rc=$?`})
				if !strings.Contains(r.Stdout, "No space left") || strings.Contains(r.Stdout, "rc=0") {
					t.Fatalf("write past the disk limit: %+v", r)
				}
				healthy(t)
			})
			t.Run("stdout_flood", func(t *testing.T) {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
				r := mustExec(t, c, sb.ID, client.ExecRequest{Timeout: 120, Cmd: `head -c 1000000000 /dev/zero`})
				if !r.StdoutTruncated || r.Status != client.StatusExited || r.ExitCode != 0 || len(r.Stdout) > 16<<20 {
					t.Fatalf("1 GB of stdout: status %s exit %d truncated %v len %d", r.Status, r.ExitCode, r.StdoutTruncated, len(r.Stdout))
				}
			})
			t.Run("spawning_loop_and_daemons", func(t *testing.T) {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
				// The loop forks at most ~100 a second (a loop at full speed
				// fills the sandbox's pids on a loaded host before the
				// timeout, and then dies of "Cannot fork" on its own): at
				// most ~200 processes by the timeout, well under --pids.
				r := mustExec(t, c, sb.ID, client.ExecRequest{Timeout: 2, Cmd: `for i in 1 2 3; do (setsid sh -c 'while :; do sleep 1; done' &) ; done; nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & while :; do sleep 0.1 & sleep 0.01; done`})
				if r.Status != client.StatusTimedOut {
					t.Fatalf("spawning loop: %+v", r)
				}
				// Every process but pid 1 (the agent), this shell and its children.
				left := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: `for p in /proc/[0-9]*; do pid=${p#/proc/}; [ "$pid" = 1 ] || [ "$pid" = $$ ] && continue; read -r line < $p/stat 2>/dev/null || continue; set -- $line; [ "$4" = $$ ] && continue; echo "$pid $2"; done`})
				if strings.TrimSpace(left.Stdout) != "" {
					t.Fatalf("processes survived the timeout:\n%s", left.Stdout)
				}
				// A daemon started in a background process dies with the sandbox.
				if _, err := c.StartProcess(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Cmd: `(setsid sleep 1000 &)`}); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("host_canary", func(t *testing.T) {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
				r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cat " + canary + "; cat /proc/1/root" + canary + "; grep -rs " + hex.EncodeToString(secret) + " /tmp /proc/1/root/tmp /mnt /home 2>/dev/null; true"})
				if strings.Contains(r.Stdout, hex.EncodeToString(secret)) {
					t.Fatalf("sandbox read the host canary: %+v", r)
				}
				if _, _, err := c.ReadFile(ctxT(t, time.Minute), sb.ID, canary); !client.IsNotFound(err) {
					t.Fatalf("file API reached the host canary: %v", err)
				}
			})
			t.Run("network_none", func(t *testing.T) {
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
				port := srv.addr[strings.LastIndex(srv.addr, ":")+1:]
				r := mustExec(t, c, sb.ID, client.ExecRequest{Timeout: 10, Cmd: `ls /sys/class/net 2>/dev/null | grep -v '^lo$'; bash -c 'echo x > /dev/tcp/127.0.0.1/` + port + `' 2>/dev/null && echo reached-host; true`})
				if strings.Contains(r.Stdout, "reached") || strings.TrimSpace(r.Stdout) != "" {
					t.Fatalf("network with network none: %+v", r)
				}
			})
			t.Run("kill_agent_from_inside", func(t *testing.T) {
				// The agent is PID 1: signals from inside are dropped, and
				// its memory cannot be opened (it is not dumpable). A
				// non-root user can do nothing to it on either runtime.
				sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
				attack := `for s in TERM INT HUP QUIT USR1 USR2 ALRM SEGV BUS FPE ILL TRAP ABRT SYS XCPU PWR KILL STOP; do kill -$s 1 2>/dev/null; done; sleep 0.5; kill -CONT 1 2>/dev/null; ` +
					`(echo x > /proc/1/mem) 2>/dev/null && echo wrote-agent-memory; (head -c 1 /proc/1/mem) 2>/dev/null && echo read-agent-memory; echo alive`
				r := mustExec(t, c, sb.ID, client.ExecRequest{Timeout: 10, User: "nobody", Cmd: attack})
				if strings.Contains(r.Stdout, "agent-memory") || !strings.HasSuffix(r.Stdout, "alive\n") {
					t.Fatalf("attack on the agent as nobody: %+v", r)
				}
				// As root: on namespaces the kernel keeps SIGKILL and SIGSTOP
				// from the namespace's init, so the agent survives. gVisor
				// lets root inside kill its init: then the sandbox must be
				// recorded as lost and cleaned up, and nothing else harmed.
				r, err := c.Exec(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Timeout: 10, Cmd: attack})
				switch {
				case err == nil:
					if strings.Contains(r.Stdout, "agent-memory") {
						t.Fatalf("root reached the agent's memory: %+v", r)
					}
					if r2 := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo still"}); r2.Stdout != "still\n" {
						t.Fatalf("after signals to the agent: %+v", r2)
					}
				case rt == client.RuntimeGVisor && client.IsSandboxNotRunning(err):
					got, _ := c.GetSandbox(context.Background(), sb.ID)
					if got.State != client.StateLost {
						t.Fatalf("sandbox after its agent was killed: %+v", got)
					}
					assertGone(t, srv, sb.ID)
				default:
					t.Fatalf("attack on the agent as root: %v", err)
				}
				healthy(t)
			})
		})
	}
}

// survivors lists the processes of a sandbox other than the agent (pid 1)
// and the listing shell itself and its children.
const survivors = `for p in /proc/[0-9]*; do pid=${p#/proc/}; [ "$pid" = 1 ] || [ "$pid" = $$ ] && continue; read -r line < $p/stat 2>/dev/null || continue; set -- $line; [ "$4" = $$ ] && continue; echo "$pid $2"; done`

// TestTimeoutKillsEveryUsersDaemons: a command that times out takes
// everything it started with it, also daemons that left its session and
// process group and run as another user than root, whose environment the
// agent cannot read (before: the marker check missed them, and
// `(setsid sleep 3003 &)` run as nobody outlived its timeout). The same
// holds for a background process killed through the API, and for a root
// command whose daemon drops to another user.
func TestTimeoutKillsEveryUsersDaemons(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c := defaultTeam(t)
			sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
			check := func(t *testing.T, what string) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for {
					left := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: survivors})
					if strings.TrimSpace(left.Stdout) == "" {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: processes survived:\n%s", what, left.Stdout)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			r := mustExec(t, c, sb.ID, client.ExecRequest{User: "nobody", Timeout: 2,
				Cmd: `(setsid sleep 3003 &); (setsid sh -c 'exec env -i sleep 3004' &); sleep 30`})
			if r.Status != client.StatusTimedOut {
				t.Fatalf("exec: %+v", r)
			}
			check(t, "timeout as nobody")
			// Root starts a daemon that becomes nobody, clears its
			// environment and leaves the session.
			r = mustExec(t, c, sb.ID, client.ExecRequest{Timeout: 2,
				Cmd: `(setsid setpriv --reuid=65534 --regid=65534 --clear-groups env -i sleep 3005 &); sleep 30`})
			if r.Status != client.StatusTimedOut {
				t.Fatalf("exec: %+v", r)
			}
			check(t, "timeout as root, daemon as nobody")
			p, err := c.StartProcess(ctxT(t, time.Minute), sb.ID, client.ExecRequest{User: "nobody", Cmd: `(setsid sleep 3006 &); sleep 600`})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			if err := c.KillProcess(ctxT(t, time.Minute), sb.ID, p.ID); err != nil {
				t.Fatal(err)
			}
			check(t, "kill of a background process")
			// A command that ends on its own may leave a daemon behind:
			// that one lives on (servers started for an episode).
			mustExec(t, c, sb.ID, client.ExecRequest{User: "nobody", Cmd: `(setsid sleep 3007 > /dev/null 2>&1 &)`})
			time.Sleep(500 * time.Millisecond)
			if left := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: `cat /proc/[0-9]*/cmdline | tr '\0' ' '`}); !strings.Contains(left.Stdout, "sleep 3007") {
				t.Fatalf("a daemon of a command that ended on its own was killed: %q", left.Stdout)
			}
		})
	}
}

// TestRootForkBombKeepsItsSandbox: a fork bomb run as root (the agent's own
// user) holds every task it can get while the agent is kept busy with
// files and commands; the sandbox must live on and answer once the bomb's
// timeout killed it. (On gVisor, before the agent kept CAP_SYS_RESOURCE to
// itself, its Go runtime died there for want of one more thread.)
func TestRootForkBombKeepsItsSandbox(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c := defaultTeam(t)
			sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
			ctx := ctxT(t, 3*time.Minute)
			bomb := make(chan error, 1)
			go func() {
				// Each process forks two copies of itself and blocks: the
				// tree holds every task it got until the timeout.
				_, err := c.Exec(ctx, sb.ID, client.ExecRequest{Timeout: 20, User: "root", Argv: []string{"bash", "-c",
					"exec 3< <(exec sleep 100000); bomb() { bomb & bomb & read -r -u 3; }; bomb"}})
				bomb <- err
			}()
			// Until a root command can no longer fork.
			deadline := time.Now().Add(time.Minute)
			for {
				r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Timeout: 5, User: "root", Cmd: "(true) && echo forked"})
				if err != nil {
					t.Fatalf("exec during the bomb: %v", err)
				}
				if !strings.Contains(r.Stdout, "forked") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the bomb never took the last task")
				}
				time.Sleep(100 * time.Millisecond)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 32)
			for range 8 {
				wg.Go(func() {
					for range 4 {
						if _, err := c.ListFiles(ctx, sb.ID, "/proc"); err != nil {
							errs <- err
							return
						}
						// The agent may fail to start it (no task left):
						// an answer either way, never a lost sandbox.
						if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Timeout: 5, Argv: []string{"true"}}); err != nil && client.IsSandboxNotRunning(err) {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("during the bomb: %v", err)
			}
			if err := <-bomb; err != nil {
				t.Fatalf("the bomb's exec: %v", err)
			}
			if r := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo alive"}); r.Stdout != "alive\n" {
				t.Fatalf("after the bomb: %+v", r)
			}
		})
	}
}
