// Package pgtest starts throwaway PostgreSQL servers for tests: initdb into
// a temporary directory, postgres on a free loopback port, a database per
// test, and at the end a fast shutdown that leaves no process and no file.
//
// The server binaries (initdb, postgres) are found in $EVALBOX_PG_BIN_DIR,
// else in `pg_config --bindir`, else in the newest /usr/lib/postgresql/*/bin
// (Debian's postgresql package). As with the repository's other test
// environment ($EVALBOX_TEST_ROOTFS), a test without them is skipped, but
// one whose $EVALBOX_PG_BIN_DIR is set fails instead: scripts/test.sh
// installs PostgreSQL and sets it, so there the tests never skip.
//
// PostgreSQL refuses to run as root. When the tests run as root (the e2e
// suite does), initdb and postgres run as the "postgres" user (else
// "nobody"), with the directory chowned to it. That directory is made with
// os.MkdirTemp, not t.TempDir: the user could not enter t.TempDir's parent
// (mode 0700, root's), and a Unix socket's path must fit in 107 bytes,
// which a subtest's TempDir path can pass.
//
// Nothing here depends on systemd or on the cluster Debian's package sets
// up: the servers are this process's children. Each gets a random password
// (scram-sha-256 on 127.0.0.1 only), so that other users of the host cannot
// use it, and so that tests see what a real DSN with a password does.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvBinDir names the environment variable that gives the directory of the
// PostgreSQL server binaries.
const EnvBinDir = "EVALBOX_PG_BIN_DIR"

// superuser is the name of the servers' superuser.
const superuser = "evalbox"

// ErrNoBinaries: no PostgreSQL server binaries were found (and
// $EVALBOX_PG_BIN_DIR is not set).
var ErrNoBinaries = errors.New("pgtest: no PostgreSQL server binaries (install Debian's postgresql package, or set " + EnvBinDir + ")")

// BinDir returns the directory of initdb and postgres. An error other
// than ErrNoBinaries means $EVALBOX_PG_BIN_DIR is set but does not hold
// them.
func BinDir() (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		if !hasServer(d) {
			return "", fmt.Errorf("pgtest: %s=%s holds no initdb and postgres", EnvBinDir, d)
		}
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		// Debian's pg_config comes with libpq-dev, also without a server.
		if d := strings.TrimSpace(string(out)); hasServer(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first (numerically: 9.6 < 10 < 15).
	slices.SortFunc(dirs, func(a, b string) int { return majorOf(b) - majorOf(a) })
	for _, d := range dirs {
		if hasServer(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func majorOf(binDir string) int {
	v := filepath.Base(filepath.Dir(binDir))
	major, _, _ := strings.Cut(v, ".")
	n, _ := strconv.Atoi(major)
	return n
}

func hasServer(dir string) bool {
	for _, b := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// Server is a running throwaway PostgreSQL server.
type Server struct {
	dir      string // everything: data, socket, log; removed by Stop
	port     int
	password string
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the postmaster has exited
	stopOnce sync.Once
	stopErr  error
}

// NewServer initialises and starts a server. The caller must Stop it.
// Without binaries it returns ErrNoBinaries.
func NewServer(ctx context.Context) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "evalbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{dir: dir, password: randomHex(16)}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	if err := os.Mkdir(filepath.Join(dir, "sock"), 0o700); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(s.password+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		for _, p := range []string{dir, filepath.Join(dir, "sock"), pwfile} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("pgtest: %w", err)
			}
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"--pgdata", filepath.Join(dir, "data"), "--username", superuser, "--pwfile", pwfile,
		"--auth", "scram-sha-256", "--encoding", "UTF8", "--locale", "C", "--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.Env = serverEnv()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	os.Remove(pwfile)
	// Another process may take the free port before postgres binds it:
	// try a few.
	for attempt := 0; ; attempt++ {
		err = s.start(ctx, bin, cred)
		if err == nil {
			break
		}
		if attempt == 2 || !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
	ok = true
	return s, nil
}

var errPortTaken = errors.New("pgtest: port taken")

// start runs postgres on a free port and waits until it accepts
// connections.
func (s *Server) start(ctx context.Context, bin string, cred *syscall.Credential) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.port = port
	logPath := filepath.Join(s.dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	// Durability is of no use to a throwaway server; what it costs (fsync
	// per commit) is, on a shared test machine.
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(s.dir, "data"),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+filepath.Join(s.dir, "sock"),
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB", "-c", "max_connections=200",
		"-c", "log_min_messages=warning", "-c", "log_min_error_statement=panic")
	cmd.Dir = s.dir
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that a last-resort kill reaches its
	// backends too; and killed with this process if it dies first
	// (SIGQUIT: immediate shutdown).
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(s.exited) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(logPath)
			if bytes.Contains(log, []byte("could not bind")) || bytes.Contains(log, []byte("Address already in use")) {
				return errPortTaken
			}
			return fmt.Errorf("pgtest: postgres exited: %v\n%s", waitErr, log)
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := pgx.Connect(cctx, s.dsn("postgres"))
		cancel()
		if err == nil {
			c.Close(ctx)
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			s.kill()
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("pgtest: postgres not ready: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the server down (fast shutdown: sessions are ended, nothing
// waits for clients) and removes its directory. It is safe to call more
// than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			s.kill()
			s.stopErr = errors.New("pgtest: postgres did not stop in 30 s after SIGINT; killed")
		}
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = fmt.Errorf("pgtest: %w", err)
		}
	})
	return s.stopErr
}

// kill kills the server's process group (the postmaster and its backends)
// and waits for the postmaster. The group is only signalled while the
// postmaster is not yet reaped, so that its id cannot be another's.
func (s *Server) kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
}

// Pid returns the postmaster's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Dir returns the directory that holds the server's data, socket and log.
func (s *Server) Dir() string { return s.dir }

// Password returns the superuser's password (tests of how it is kept out
// of logs and errors need it).
func (s *Server) Password() string { return s.password }

func (s *Server) dsn(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(superuser, s.password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// CreateDatabase creates a new empty database and returns its DSN (a
// postgres:// URL with the superuser's password).
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	name := "t_" + randomHex(8)
	if err := s.admin(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	return s.dsn(name), nil
}

// DropDatabase drops the database of a DSN CreateDatabase returned,
// ending its sessions.
func (s *Server) DropDatabase(ctx context.Context, dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if err := s.admin(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database: %w", err)
	}
	return nil
}

func (s *Server) admin(ctx context.Context, stmt string) error {
	c, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	_, err = c.Exec(ctx, stmt)
	return err
}

// Database creates a database for t, dropped at t's cleanup, and returns
// its DSN.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	dsn, err := s.CreateDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.DropDatabase(context.Background(), dsn); err != nil {
			t.Error(err)
		}
	})
	return dsn
}

// Start starts a server of t's own and returns the DSN of a database on
// it; the server is stopped and removed at t's cleanup. Without binaries t
// is skipped (failed if $EVALBOX_PG_BIN_DIR is set).
func Start(t testing.TB) string {
	t.Helper()
	s := startOrSkip(t)
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	dsn, err := s.CreateDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

func startOrSkip(t testing.TB) *Server {
	t.Helper()
	s, err := NewServer(t.Context())
	if errors.Is(err, ErrNoBinaries) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var shared struct {
	mu  sync.Mutex
	srv *Server
}

// Shared returns a new database, dropped at t's cleanup, on a server that
// the test binary's tests share: started by the first call, it is stopped
// by StopShared, which the package's TestMain must call after m.Run.
// Without binaries t is skipped (failed if $EVALBOX_PG_BIN_DIR is set).
func Shared(t testing.TB) string {
	t.Helper()
	shared.mu.Lock()
	if shared.srv == nil {
		s, err := NewServer(context.Background())
		if err != nil {
			shared.mu.Unlock()
			if errors.Is(err, ErrNoBinaries) {
				t.Skip(err)
			}
			t.Fatal(err)
		}
		shared.srv = s
	}
	s := shared.srv
	shared.mu.Unlock()
	return s.Database(t)
}

// StopShared stops the server Shared started, if any.
func StopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil {
		return nil
	}
	err := shared.srv.Stop()
	shared.srv = nil
	return err
}

// serverCredential returns who initdb and postgres run as: nil (this
// process's user) unless that is root, which PostgreSQL refuses.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, errors.New("pgtest: running as root, and neither a postgres nor a nobody user to run PostgreSQL as")
}

// serverEnv is the environment of initdb and postgres: this process's,
// without the libpq variables (PGDATA, PGPORT, … would change what they
// do), in the C locale.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "LANG") {
			env = append(env, kv)
		}
	}
	return append(env, "LC_ALL=C", "TZ=UTC")
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
