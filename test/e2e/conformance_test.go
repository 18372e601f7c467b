package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TestConformance runs the same behaviour checks on every runtime through
// the REST API.
func TestConformance(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c := defaultTeam(t)
			sb := mustCreate(t, c, client.CreateSandboxRequest{Template: "base", Runtime: rt,
				Env: map[string]string{"SANDBOX_VAR": "from-create"}, Metadata: map[string]string{"suite": "conformance"}})
			if sb.Runtime != rt || sb.State != client.StateRunning || sb.TemplateDigest == "" || sb.RuntimeVersion == "" {
				t.Fatalf("created sandbox = %+v", sb)
			}
			if len(sb.EnvKeys) != 1 || sb.EnvKeys[0] != "SANDBOX_VAR" {
				t.Errorf("env_keys = %v", sb.EnvKeys)
			}
			id := sb.ID

			t.Run("stdout_stderr_exit", func(t *testing.T) {
				r := mustExec(t, c, id, client.ExecRequest{Cmd: "echo hi; echo err >&2; exit 3"})
				if r.Stdout != "hi\n" || r.Stderr != "err\n" || r.ExitCode != 3 || r.Status != client.StatusExited {
					t.Fatalf("got %+v", r)
				}
			})
			t.Run("argv_cwd_env_user", func(t *testing.T) {
				r := mustExec(t, c, id, client.ExecRequest{Argv: []string{"sh", "-c", `echo "$PWD $SANDBOX_VAR $X $(id -un)"`},
					Cwd: "/tmp", Env: map[string]string{"X": "y"}, User: "nobody"})
				if r.Stdout != "/tmp from-create y nobody\n" || r.ExitCode != 0 {
					t.Fatalf("got %+v", r)
				}
				r = mustExec(t, c, id, client.ExecRequest{Cmd: "pwd; id -u"})
				if r.Stdout != "/work\n0\n" {
					t.Fatalf("default cwd/user: %q", r.Stdout)
				}
			})
			t.Run("stdin", func(t *testing.T) {
				in := "line1\nline2\n"
				r := mustExec(t, c, id, client.ExecRequest{Cmd: "wc -l", Stdin: &in})
				if strings.TrimSpace(r.Stdout) != "2" {
					t.Fatalf("got %+v", r)
				}
			})
			t.Run("no_such_command", func(t *testing.T) {
				r := mustExec(t, c, id, client.ExecRequest{Argv: []string{"/nope"}})
				if r.Status != client.StatusError || r.Error == "" {
					t.Fatalf("got %+v", r)
				}
			})
			t.Run("timeout_kills_tree_keeps_output", func(t *testing.T) {
				start := time.Now()
				r := mustExec(t, c, id, client.ExecRequest{Timeout: 1, Cmd: `echo before; (sleep 1000 &); setsid sh -c 'sleep 1000' & sleep 1000`})
				if r.Status != client.StatusTimedOut || r.Stdout != "before\n" {
					t.Fatalf("got %+v", r)
				}
				if d := time.Since(start); d > 20*time.Second {
					t.Fatalf("timeout took %v", d)
				}
				left := mustExec(t, c, id, client.ExecRequest{Cmd: "grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l"})
				if strings.TrimSpace(left.Stdout) != "0" {
					t.Fatalf("%s sleep processes survived the timeout", strings.TrimSpace(left.Stdout))
				}
			})
			t.Run("output_cap", func(t *testing.T) {
				r := mustExec(t, c, id, client.ExecRequest{Cmd: "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2", MaxOutputBytes: 1 << 20})
				if !r.StdoutTruncated || len(r.Stdout) != 1<<20 || r.StderrTruncated || r.Stderr != "done\n" || r.ExitCode != 0 {
					t.Fatalf("got status=%s exit=%d len(stdout)=%d truncated=%v/%v stderr=%q", r.Status, r.ExitCode, len(r.Stdout), r.StdoutTruncated, r.StderrTruncated, r.Stderr)
				}
			})
			t.Run("output_limit_kills", func(t *testing.T) {
				// A flood stops at the cap, killed with its whole tree, long
				// before its timeout.
				r := mustExec(t, c, id, client.ExecRequest{Cmd: "(yes b >&2 &); yes a", MaxOutputBytes: 64 << 10, KillOnOutputLimit: true, Timeout: 60})
				if r.Status != client.StatusKilled || !r.OutputLimitExceeded || !r.StdoutTruncated && !r.StderrTruncated || len(r.Stdout) > 64<<10 || r.MemoryLimitExceeded {
					t.Fatalf("got status=%s signal=%d exceeded=%v len(stdout)=%d truncated=%v/%v", r.Status, r.Signal, r.OutputLimitExceeded, len(r.Stdout), r.StdoutTruncated, r.StderrTruncated)
				}
				left := mustExec(t, c, id, client.ExecRequest{Cmd: "grep -lx yes /proc/[0-9]*/comm 2>/dev/null | wc -l"})
				if strings.TrimSpace(left.Stdout) != "0" {
					t.Fatalf("%s yes processes survived the output limit", strings.TrimSpace(left.Stdout))
				}
				// Under the cap: an ordinary exit.
				r = mustExec(t, c, id, client.ExecRequest{Cmd: "echo fine", MaxOutputBytes: 64 << 10, KillOnOutputLimit: true})
				if r.Status != client.StatusExited || r.OutputLimitExceeded || r.Stdout != "fine\n" {
					t.Fatalf("under the cap: %+v", r)
				}
			})
			t.Run("memory_limit_kills", func(t *testing.T) {
				// A shell string that doubles until the limit stops it, in a
				// child of the command (the tree is measured, not one process).
				r := mustExec(t, c, id, client.ExecRequest{Cmd: `bash -c 'x=a; while :; do x=$x$x; done'; echo after`, MemoryLimitMB: 64, Timeout: 60})
				if r.Status != client.StatusKilled || !r.MemoryLimitExceeded || r.OutputLimitExceeded || r.PeakMemoryBytes <= 64<<20 || strings.Contains(r.Stdout, "after") {
					t.Fatalf("got %+v", r)
				}
				// Within the limit: an ordinary exit, its peak reported.
				r = mustExec(t, c, id, client.ExecRequest{Cmd: `x=$(head -c 4000000 /dev/zero | tr '\0' a); sleep 0.1; echo ${#x}`, MemoryLimitMB: 64})
				if r.Status != client.StatusExited || r.MemoryLimitExceeded || r.Stdout != "4000000\n" || r.PeakMemoryBytes <= 0 || r.PeakMemoryBytes > 64<<20 {
					t.Fatalf("within the limit: %+v", r)
				}
			})
			t.Run("streaming", func(t *testing.T) {
				var out, errb bytes.Buffer
				r, err := c.ExecStream(ctxT(t, time.Minute), id, client.ExecRequest{Cmd: "for i in 1 2 3; do echo $i; echo e$i >&2; done; exit 4"}, &out, &errb)
				if err != nil {
					t.Fatal(err)
				}
				if out.String() != "1\n2\n3\n" || errb.String() != "e1\ne2\ne3\n" || r.ExitCode != 4 {
					t.Fatalf("stdout %q stderr %q result %+v", out.String(), errb.String(), r)
				}
			})
			t.Run("background", func(t *testing.T) {
				ctx := ctxT(t, time.Minute)
				p, err := c.StartProcess(ctx, id, client.ExecRequest{Cmd: "echo started; sleep 0.5; echo finished; exit 7", Tag: "bg"})
				if err != nil {
					t.Fatal(err)
				}
				ps, err := c.ListProcesses(ctx, id)
				if err != nil || !containsProc(ps, p.ID) {
					t.Fatalf("list = %+v, %v", ps, err)
				}
				r, err := c.WaitProcess(ctx, id, p.ID, 30*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if r.Stdout != "started\nfinished\n" || r.ExitCode != 7 {
					t.Fatalf("wait = %+v", r)
				}
				// Kill a long one; its whole tree goes with it, also a
				// descendant that left the process group.
				p2, err := c.StartProcess(ctx, id, client.ExecRequest{Cmd: "setsid sleep 1000 & sleep 1000"})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.KillProcess(ctx, id, p2.ID); err != nil {
					t.Fatal(err)
				}
				r2, err := c.WaitProcess(ctx, id, p2.ID, 30*time.Second)
				if err != nil || r2.Status != client.StatusKilled {
					t.Fatalf("killed wait = %+v, %v", r2, err)
				}
				if left := mustExec(t, c, id, client.ExecRequest{Cmd: "grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l"}); strings.TrimSpace(left.Stdout) != "0" {
					t.Fatalf("%s sleep processes survived the kill", strings.TrimSpace(left.Stdout))
				}
				if err := c.KillProcess(ctx, id, p2.ID); err != nil {
					t.Fatalf("killing an ended process: %v", err)
				}
				if _, err := c.WaitProcess(ctx, id, "nope", time.Second); !client.IsNotFound(err) {
					t.Fatalf("unknown process: %v", err)
				}
			})
			t.Run("files", func(t *testing.T) {
				ctx := ctxT(t, 2*time.Minute)
				data := make([]byte, 10<<20+123)
				_, _ = rand.Read(data)
				fi, err := c.WriteFile(ctx, id, "/work/sub/dir/blob.bin", bytes.NewReader(data), int64(len(data)), 0o600)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Size != int64(len(data)) || fi.Mode != "0600" || fi.Type != "file" {
					t.Fatalf("write info %+v", fi)
				}
				rc, size, err := c.ReadFile(ctx, id, "/work/sub/dir/blob.bin")
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || size != int64(len(data)) || sha256.Sum256(got) != sha256.Sum256(data) {
					t.Fatalf("read back %d bytes (size %d), err %v", len(got), size, err)
				}
				r := mustExec(t, c, id, client.ExecRequest{Cmd: "sha256sum /work/sub/dir/blob.bin | cut -c1-64"})
				if strings.TrimSpace(r.Stdout) != sha256hex(data) {
					t.Fatalf("sandbox sees %q", r.Stdout)
				}
				if _, err := c.Mkdir(ctx, id, client.MkdirRequest{Path: "/work/a/b", Parents: true}); err != nil {
					t.Fatal(err)
				}
				list, err := c.ListFiles(ctx, id, "/work")
				if err != nil || !containsFile(list, "a", "dir") || !containsFile(list, "sub", "dir") {
					t.Fatalf("list = %+v, %v", list, err)
				}
				st, err := c.StatFile(ctx, id, "/work/a")
				if err != nil || st.Type != "dir" {
					t.Fatalf("stat = %+v, %v", st, err)
				}
				if err := c.RemoveFile(ctx, id, "/work/sub", true); err != nil {
					t.Fatal(err)
				}
				if _, err := c.StatFile(ctx, id, "/work/sub"); !client.IsNotFound(err) {
					t.Fatalf("stat removed: %v", err)
				}
				// Paths are cleaned inside the sandbox root: ".." cannot leave it.
				if _, err := c.WriteFile(ctx, id, "/../../../tmp/x", strings.NewReader("x"), 1, 0o644); err != nil {
					t.Fatal(err)
				}
				r = mustExec(t, c, id, client.ExecRequest{Cmd: "cat /tmp/x"})
				if r.Stdout != "x" {
					t.Fatalf("cleaned path: %q", r.Stdout)
				}
				if _, err := c.StatFile(ctx, id, "relative/path"); client.ErrorCode(err) != client.CodeBadRequest {
					t.Fatalf("relative path: %v", err)
				}
			})
			t.Run("get_list_timeout", func(t *testing.T) {
				ctx := ctxT(t, time.Minute)
				got, err := c.GetSandbox(ctx, id)
				if err != nil || got.ID != id {
					t.Fatalf("get: %+v %v", got, err)
				}
				list, err := c.ListSandboxes(ctx, client.ListOptions{Metadata: map[string]string{"suite": "conformance"}})
				if err != nil || len(list) != 1 || list[0].ID != id {
					t.Fatalf("list: %+v %v", list, err)
				}
				up, err := c.SetTimeout(ctx, id, time.Hour)
				if err != nil || time.Until(up.ExpiresAt) < 59*time.Minute {
					t.Fatalf("timeout: %+v %v", up, err)
				}
			})
		})
	}
}

func containsProc(ps []client.Process, id string) bool {
	for _, p := range ps {
		if p.ID == id {
			return true
		}
	}
	return false
}

func containsFile(fs []client.FileInfo, name, typ string) bool {
	for _, f := range fs {
		if f.Name == name && f.Type == typ {
			return true
		}
	}
	return false
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	const hexd = "0123456789abcdef"
	out := make([]byte, 64)
	for i, c := range s {
		out[2*i], out[2*i+1] = hexd[c>>4], hexd[c&15]
	}
	return string(out)
}
