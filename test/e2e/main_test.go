// Package e2e tests evalbox end to end through the real stack: the built
// `evalbox serve` binary with real runsc (gVisor) and namespaces sandboxes,
// real SQLite, driven through the Go client and the CLI.
//
// Binaries come from EVALBOX_BIN_DIR (default: <repo>/bin, built by
// scripts/build.sh); templates from EVALBOX_TEMPLATES_DIR (default
// /var/cache/evalbox/templates: built once, reused by every run).
package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/runtime/network"
	"github.com/evalbox/evalbox/pkg/client"
)

var (
	binDir       string
	templatesDir string
	srv          *server // the shared server of the package's tests
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: skipped: needs root (sandboxes need namespaces, cgroups and mounts)")
		os.Exit(0)
	}
	binDir = os.Getenv("EVALBOX_BIN_DIR")
	if binDir == "" {
		binDir, _ = filepath.Abs("../../bin")
	}
	templatesDir = os.Getenv("EVALBOX_TEMPLATES_DIR")
	if templatesDir == "" {
		templatesDir = "/var/cache/evalbox/templates"
	}
	for _, b := range []string{"evalbox", "evalbox-agent", "runsc"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %s missing in %s: run scripts/build.sh first\n", b, binDir)
			os.Exit(1)
		}
	}
	// The servers install the host's evalbox iptables chains and leave
	// them for the next server; the suite removes them at its end if they
	// were not there at its start.
	chainsExisted := exec.Command("iptables", "--wait", "-t", "filter", "-S", network.ChainFwd).Run() == nil
	var err error
	srv, err = startServer(serverOptions{args: []string{"--sandbox-domain", sandboxDomain}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := srv.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stopping server:", err)
		code = 1
	}
	if !chainsExisted {
		removeChains()
	}
	os.Exit(code)
}

// removeChains deletes the evalbox iptables chains and the jumps to them.
func removeChains() {
	for _, c := range [][3]string{{"filter", "FORWARD", network.ChainFwd}, {"filter", "INPUT", network.ChainIn}, {"nat", "POSTROUTING", network.ChainNAT}} {
		for exec.Command("iptables", "--wait", "-t", c[0], "-D", c[1], "-j", c[2]).Run() == nil {
		}
		_ = exec.Command("iptables", "--wait", "-t", c[0], "-F", c[2]).Run()
		_ = exec.Command("iptables", "--wait", "-t", c[0], "-X", c[2]).Run()
	}
}

// sandboxDomain is the suite server's --sandbox-domain (host-form port
// URLs are reached by setting the Host header: nothing resolves it).
const sandboxDomain = "sandboxes.evalbox.test"

type serverOptions struct {
	dataDir string   // reuse a data dir (restart tests); "" = new temp dir
	args    []string // extra serve flags
	// listenAll makes the server listen on every address (the client still
	// uses 127.0.0.1), to test that sandboxes cannot reach it.
	listenAll bool
	// ctty, a terminal (the slave of a pty), becomes the server's stdin
	// and controlling terminal, as when an operator runs `evalbox serve &`
	// in a shell.
	ctty *os.File
	// binDir runs the evalbox binary of this directory ("" = binDir).
	binDir string
}

// server is a running `evalbox serve` process.
type server struct {
	cmd      *exec.Cmd
	dataDir  string
	ownDir   bool
	addr     string
	url      string
	adminKey string
	admin    *client.Client
	logPath  string
	exited   chan error
	// nodeURL is a fleet replica's --node-listen (https), and certs the
	// directory of the fleet's certificates (startFleetReplicas).
	nodeURL, certs string
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startServerT starts a server of o for the rest of t, and stops it at
// its end.
func startServerT(t *testing.T, o serverOptions) *server {
	t.Helper()
	s, err := startServer(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("stop server: %v", err)
		}
	})
	return s
}

func startServer(o serverOptions) (*server, error) {
	s := &server{dataDir: o.dataDir}
	if s.dataDir == "" {
		d, err := os.MkdirTemp("", "evalbox-e2e-")
		if err != nil {
			return nil, err
		}
		s.dataDir, s.ownDir = d, true
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	s.addr, s.url = addr, "http://"+addr
	listen := addr
	if o.listenAll {
		_, port, _ := net.SplitHostPort(addr)
		listen = "0.0.0.0:" + port
	}
	s.logPath = filepath.Join(s.dataDir, "server.log")
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--data-dir", s.dataDir, "--listen", listen,
		"--templates-dir", templatesDir, "--log-level", "debug"}, o.args...)
	dir := binDir
	if o.binDir != "" {
		dir = o.binDir
	}
	s.cmd = exec.Command(filepath.Join(dir, "evalbox"), args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if o.ctty != nil {
		// A session of its own (its process group id is still its pid)
		// whose controlling terminal is ctty.
		s.cmd.Stdin = o.ctty
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	logf.Close()
	s.exited = make(chan error, 1)
	go func() { s.exited <- s.cmd.Wait() }()
	// Built-in templates may be built on a first run: allow minutes.
	deadline := time.Now().Add(10 * time.Minute)
	for {
		select {
		case err := <-s.exited:
			return nil, fmt.Errorf("server exited: %v\n%s", err, tail(s.logPath, 30))
		default:
		}
		if key, err := os.ReadFile(filepath.Join(s.dataDir, "admin.key")); err == nil && len(key) > 0 {
			c := client.New(s.url, strings.TrimSpace(string(key)))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, herr := c.Health(ctx)
			cancel()
			if herr == nil {
				s.adminKey = strings.TrimSpace(string(key))
				s.admin = c
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			_ = s.kill()
			return nil, fmt.Errorf("server did not come up\n%s", tail(s.logPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop shuts the server down gracefully (SIGTERM) and removes its data dir
// if the test made it.
func (s *server) stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-s.exited:
	case <-time.After(60 * time.Second):
		_ = s.kill()
		err = errors.New("server did not stop in 60s")
	}
	if s.ownDir {
		_ = os.RemoveAll(s.dataDir)
	}
	return err
}

// kill kills the server hard (SIGKILL), leaving its sandboxes behind.
func (s *server) kill() error {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		return errors.New("server did not die")
	}
	return nil
}

// crash kills the server process alone with SIGKILL, as `kill -9 <pid>`
// or the OOM killer do: the processes it started (runsc commands in
// flight, sandboxes) are orphaned, not killed with it.
func (s *server) crash() error {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		return errors.New("server did not die")
	}
	return nil
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
