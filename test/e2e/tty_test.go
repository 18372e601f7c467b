package e2e

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/pkg/client"
)

// ttyAttack is what a sample runs to reach the terminal of the shell that
// started the server: open /dev/tty (the controlling terminal), push a
// command line into its input queue with TIOCSTI, and read what the
// operator types. It prints one word per step.
const ttyAttack = `import os, fcntl, termios
out = []
try:
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    out.append("opened")
    try:
        for c in b"echo PWNED-BY-SANDBOX\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))
        out.append("injected")
    except OSError as e:
        out.append("tiocsti-errno-%d" % e.errno)
    os.set_blocking(fd, False)
    try:
        out.append("read-" + os.read(fd, 200).decode(errors="replace").strip())
    except OSError as e:
        out.append("read-errno-%d" % e.errno)
except OSError as e:
    out.append("open-errno-%d" % e.errno)
print(" ".join(out))
`

// TestNoTerminalInjection: a server started from a terminal (the pty is its
// controlling terminal, as for `evalbox serve &` typed in a shell) runs
// sandboxes that cannot reach that terminal, on either runtime, as root or
// as a sample's uid: /dev/tty does not open (ENXIO: no controlling
// terminal in the sandbox's session), nothing is injected into the
// terminal's input, and nothing the operator types is read. Before the
// fix the namespaces tier shared the server's session: the injected line
// reached the shell as root.
func TestNoTerminalInjection(t *testing.T) {
	master, slave, err := openPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	defer slave.Close()
	s, err := startServer(serverOptions{ctty: slave})
	if err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	// The operator types a secret; a sandbox that could read the
	// terminal would get it.
	if _, err := master.Write([]byte("operator-secret\n")); err != nil {
		t.Fatal(err)
	}
	c, _, _ := newTeam(t, s, client.Limits{MaxSandboxes: 10, MaxConcurrentExec: 10})
	for _, rt := range runtimes {
		for _, user := range []string{"root", "65534"} {
			sb, err := c.CreateSandbox(ctxT(t, 2*time.Minute), client.CreateSandboxRequest{Template: "python", Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			r, err := c.Exec(ctxT(t, time.Minute), sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", ttyAttack}, User: user, Timeout: 30})
			if err != nil {
				t.Fatal(err)
			}
			got := strings.TrimSpace(r.Stdout)
			t.Logf("%s as %s: %s %s", rt, user, got, strings.TrimSpace(r.Stderr))
			if got != fmt.Sprintf("open-errno-%d", unix.ENXIO) {
				t.Errorf("%s as %s reached a terminal: %q (stderr %q)", rt, user, got, r.Stderr)
			}
			if err := c.DeleteSandbox(ctxT(t, time.Minute), sb.ID); err != nil {
				t.Fatal(err)
			}
			assertGone(t, s, sb.ID)
		}
	}
	// The same attack as an eval sample (uid 65534, the harness's way).
	prob := client.EvalProblem{TaskID: "tty/0", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(candidate):\n    assert candidate() == 1\n"}
	attack := "    exec(" + fmt.Sprintf("%q", ttyAttack) + ")\n    return 1\n"
	for _, rt := range runtimes {
		run, err := c.CreateEval(ctxT(t, time.Minute), client.CreateEvalRequest{Problems: []client.EvalProblem{prob},
			Samples: []client.EvalSample{{TaskID: "tty/0", Completion: &attack}}, Runtime: rt, Template: "python", Timeout: 30})
		if err != nil {
			t.Fatal(err)
		}
		waitEval(t, c, run.ID, 3*time.Minute)
	}
	// Nothing arrived in the terminal's input queue: the shell reading it
	// would have run the injected line.
	time.Sleep(200 * time.Millisecond)
	if err := unix.SetNonblock(int(slave.Fd()), true); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, _ := unix.Read(int(slave.Fd()), buf)
	if n > 0 && bytes.Contains(buf[:n], []byte("PWNED")) {
		t.Fatalf("a sandbox typed into the server's terminal: %q", buf[:n])
	}
	if n <= 0 || !bytes.Contains(buf[:n], []byte("operator-secret")) {
		t.Fatalf("the operator's input was consumed (read %d: %q)", n, buf[:max(n, 0)])
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	sl, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, sl, nil
}
