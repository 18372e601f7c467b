// Command evalbox-agent is the guest agent that runs inside every sandbox,
// usually as its first process. It serves the agent protocol
// (internal/agentproto) on its stdin/stdout and exits when that connection
// closes, after killing every process it started (everything, when it is
// PID 1).
//
// It is built static (CGO_ENABLED=0) and imports only the standard
// library, golang.org/x/sys, yamux and the agent packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/agent"
	"github.com/evalbox/evalbox/internal/agentproto"
)

func main() {
	os.Exit(run())
}

func run() int {
	var cfg agent.Config
	var logLevel slog.Level
	flag.StringVar(&cfg.Workdir, "workdir", agent.DefaultWorkdir, "default working directory of processes (created if missing)")
	flag.StringVar(&cfg.User, "user", "", "default user (name or uid) of processes and owner of written files (default: the agent's user)")
	flag.Int64Var(&cfg.DefaultMaxOutput, "max-output", agent.DefaultMaxOutput, "default per-stream output cap in bytes")
	flag.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level (debug, info, warn, error)")
	spare := flag.Int("spare-threads", 0, "threads to make at start and keep idle for later needs (for a runtime whose pids limit the agent shares with its commands)")
	listen := flag.String("listen", "", "serve on a unix socket at this path instead of stdin/stdout (processes then outlive connections)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))
	cfg.Logger = log
	if v, ok := os.LookupEnv(agentproto.CgroupEnv); ok {
		os.Unsetenv(agentproto.CgroupEnv)
		dir, err := openCgroup(v)
		if err != nil {
			// Still usable, with the weaker tree kill: say so.
			log.Error("agent: no cgroup per process", "err", err)
		} else {
			cfg.Cgroup = dir
		}
	}

	// Not dumpable: code in the sandbox, even as the same user, can
	// neither read nor write the agent's memory through /proc/1/mem.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Warn("cannot make the agent non-dumpable", "err", err)
	}
	// Before any process starts: the capabilities the runtime gave the
	// agent alone stay the agent's. Failing that, the agent must not run
	// its commands with them.
	if err := agent.SealCapabilities(); err != nil {
		log.Error("agent: capabilities", "err", err)
		return 1
	}
	agent.KeepSpareThreads(*spare)
	pid1 := os.Getpid() == 1
	if !pid1 {
		// Orphans of the processes we start are reparented to us, so that
		// they are reaped here and found by the tree kill.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Warn("cannot become child subreaper", "err", err)
		}
	}
	// A write to a closed stdout must fail with EPIPE, not kill the agent
	// before it has killed its processes. (Notify, not Ignore: an ignored
	// signal would stay ignored in every process the agent starts.)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx := context.Background()
	if pid1 {
		// As the sandbox's init, the agent ends only when the host closes
		// the connection or kills the sandbox from outside. Signals sent
		// from inside (by the code under test) are received and dropped —
		// all of them: Go's own handlers would otherwise let a TERM, or a
		// SEGV or BUS sent with kill(2), end the agent.
		drop := make(chan os.Signal, 8)
		signal.Notify(drop)
		go func() {
			for range drop {
			}
		}()
	} else {
		// Signals the agent was started with ignored (nohup's SIGHUP) stay
		// ignored by the agent, received and dropped, but not by its
		// processes: an ignored signal is inherited across exec, a caught
		// one is reset.
		drop := make(chan os.Signal, 8)
		for sig := syscall.Signal(1); sig < 32; sig++ {
			if sig != syscall.SIGKILL && sig != syscall.SIGSTOP && signal.Ignored(sig) {
				signal.Notify(drop, sig)
			}
		}
		go func() {
			for range drop {
			}
		}()
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
		defer stop()
	}

	var err error
	if *listen != "" {
		err = serveUnix(ctx, *listen, cfg)
	} else {
		var conn stdio
		if conn, err = stdioConn(); err != nil {
			log.Error("agent: stdio", "err", err)
			return 1
		}
		err = agent.Serve(ctx, conn, cfg)
	}
	if pid1 {
		// The sandbox ends with us: take everything down first.
		syscall.Kill(-1, syscall.SIGKILL)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("agent stopped", "err", err)
		return 1
	}
	return 0
}

// openCgroup opens the cgroup directory the runtime gave the agent (see
// agentproto.CgroupEnv).
func openCgroup(v string) (*os.File, error) {
	kind, arg, _ := strings.Cut(v, ":")
	switch kind {
	case "fd":
		fd, err := strconv.Atoi(arg)
		if err != nil || fd < 3 {
			return nil, fmt.Errorf("%s=%q: bad descriptor", agentproto.CgroupEnv, v)
		}
		unix.CloseOnExec(fd)
		return os.NewFile(uintptr(fd), "cgroup"), nil
	case "path":
		// The agent's own cgroup in the cgroup2 mount at arg.
		b, err := os.ReadFile("/proc/self/cgroup")
		if err != nil {
			return nil, err
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if rel, ok := strings.CutPrefix(line, "0::"); ok {
				return os.Open(filepath.Join(arg, filepath.Clean("/"+rel)))
			}
		}
		return nil, fmt.Errorf("no cgroup2 entry in /proc/self/cgroup: %q", b)
	}
	return nil, fmt.Errorf("%s=%q: want fd:N or path:DIR", agentproto.CgroupEnv, v)
}

// serveUnix serves the agent protocol on a unix socket at path (only the
// agent's user may connect).
func serveUnix(ctx context.Context, path string, cfg agent.Config) error {
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer os.Remove(path)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("agent: %w", err)
	}
	return agent.ServeListener(ctx, ln, cfg)
}

// stdio is the connection to the host: stdin and stdout.
type stdio struct {
	r, w *os.File
}

func (c stdio) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c stdio) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c stdio) Close() error {
	return errors.Join(c.r.Close(), c.w.Close())
}

// stdioConn returns stdin/stdout as the connection. Pipes and sockets are
// switched to non-blocking mode so that Go's poller serves them (Close
// then interrupts a pending read), and pipes get a 1 MiB buffer for
// throughput when the kernel allows it.
func stdioConn() (stdio, error) {
	files := [2]*os.File{}
	for i, fd := range []int{0, 1} {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return stdio{}, fmt.Errorf("fd %d: %w", fd, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFIFO:
			unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, 1<<20)
			unix.SetNonblock(fd, true)
		case unix.S_IFSOCK:
			unix.SetNonblock(fd, true)
		}
		files[i] = os.NewFile(uintptr(fd), []string{"stdin", "stdout"}[i])
	}
	return stdio{r: files[0], w: files[1]}, nil
}
