// Package agent is the guest agent that runs inside every sandbox: it
// serves the agentproto protocol (exec, background processes, signals,
// files) over one byte stream.
//
// The agent may be PID 1 of its sandbox: it then reaps every orphan. It
// starts processes itself (fork/exec, never os/exec) and collects their
// exit statuses in one reaper per process, so that reaping orphans never
// steals the status of a process it waits for.
package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/evalbox/evalbox/internal/agentproto"
)

// Defaults of Config.
const (
	DefaultWorkdir   = "/work"
	DefaultMaxOutput = 16 << 20
)

const (
	// maxFinished is how many finished background processes are kept for
	// Wait, Attach and List.
	maxFinished = 256
	// maxRetainedOutput bounds the output kept by finished background
	// processes; the oldest are forgotten first.
	maxRetainedOutput = 64 << 20
)

// Config configures an agent.
type Config struct {
	// Workdir is the default working directory of processes; it is created
	// (owned by User) if missing. "" = DefaultWorkdir.
	Workdir string
	// User is the default user (name or uid) of processes and the owner of
	// files and directories created by the file operations. "" = the
	// agent's own user.
	User string
	// DefaultMaxOutput is the per-stream output cap of a process whose
	// request sets none. 0 = DefaultMaxOutput.
	DefaultMaxOutput int64
	// Env is the base environment of every process, as KEY=VALUE. nil =
	// the agent's own environment.
	Env []string
	// Logger receives lifecycle logs. nil = no logs.
	Logger *slog.Logger
	// Cgroup is a cgroup2 directory the agent may create cgroups below and
	// move processes into (the runtime delegates it): every process gets
	// a cgroup of its own there, and a tree kill kills that cgroup, which
	// no process can leave. nil: trees are found by process group,
	// ancestry and an environment marker, which a daemon of another user
	// can escape (the agent cannot read its environment).
	Cgroup *os.File
}

// server is the state of one Serve call.
type server struct {
	cfg  Config
	log  *slog.Logger
	env  []string // base environment, without any markerEnv entry
	runs sync.WaitGroup
	// cgroups makes a cgroup per process (nil without Config.Cgroup).
	cgroups *cgroupTree

	mu       sync.Mutex
	closed   bool             // no new processes once set
	procs    map[string]*proc // running, and finished background ones
	finished []*proc          // finished background processes, oldest first
	retained int64            // output bytes kept by finished ones
}

// Serve runs the agent on conn until the connection closes or ctx is done,
// then kills every process it started and returns. It returns nil when the
// host closed the connection.
func Serve(ctx context.Context, conn io.ReadWriteCloser, cfg Config) error {
	s, err := newServer(cfg)
	if err != nil {
		conn.Close()
		return err
	}
	s.log.Info("agent serving", "pid", os.Getpid(), "workdir", s.cfg.Workdir, "reap_all", getReaper().reapAll)
	// Sessions follow one another on conn when the host suspends one
	// (OpSuspend, before a snapshot): processes outlive them.
	ho := agentproto.NewHandover(conn)
	var sc io.ReadWriteCloser = ho.Session()
	for {
		next, serr := s.session(ctx, sc, ho)
		if next == nil {
			err = serr
			break
		}
		s.log.Info("agent session handed over")
		sc = next
	}
	s.shutdown()
	s.log.Info("agent stopped")
	if err != nil {
		return err
	}
	return ctx.Err()
}

// ServeListener runs the agent on every connection accepted from ln (a
// unix socket, later vsock) until ctx is done, then kills every process it
// started. Processes outlive connections: a host that reconnects lists,
// attaches to and waits for the background processes it started before.
func ServeListener(ctx context.Context, ln net.Listener, cfg Config) error {
	s, err := newServer(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	s.log.Info("agent listening", "pid", os.Getpid(), "addr", ln.Addr().String())
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var conns sync.WaitGroup
	for {
		conn, err := ln.Accept()
		if err != nil {
			break
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			if _, err := s.session(ctx, conn, nil); err != nil {
				s.log.Warn("agent session", "err", err)
			}
		}()
	}
	s.shutdown()
	conns.Wait()
	s.log.Info("agent stopped")
	return ctx.Err()
}

// session serves one host connection until it closes or ctx is done. Its
// foreground execs end with it; background processes do not. With ho (the
// connection is ho's current session) the host may suspend it: session
// then returns the connection of the next session.
func (s *server) session(ctx context.Context, conn io.ReadWriteCloser, ho *agentproto.Handover) (*agentproto.Session, error) {
	sess, err := yamux.Server(conn, agentproto.YamuxConfig())
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("agent: start session: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	var (
		handlers   sync.WaitGroup
		nextMu     sync.Mutex
		suspending bool
		next       *agentproto.Session
	)
	suspend := func(nonce []byte) *agentproto.Error {
		if ho == nil {
			return errorf(agentproto.CodeBadRequest, "this agent's sessions cannot be suspended (it listens for connections)")
		}
		if len(nonce) != agentproto.NonceSize {
			return errorf(agentproto.CodeBadRequest, "suspend: nonce of %d bytes, want %d", len(nonce), agentproto.NonceSize)
		}
		nextMu.Lock()
		defer nextMu.Unlock()
		if suspending {
			return errorf(agentproto.CodeExists, "suspend: the session is already being suspended")
		}
		suspending = true
		return nil
	}
	// handOver ends the session: its reads and writes stop at once (the
	// next session's reads begin after MarkerToAgent), its streams are
	// cut; once every handler has returned (a foreground exec's process
	// tree killed), the marker tells the host the agent is quiet.
	var marker []byte
	handOver := func(nonce []byte) {
		nextMu.Lock()
		n, err := ho.Next(nil, agentproto.MarkerToAgent(nonce))
		if err != nil {
			s.log.Warn("agent: hand over the session", "err", err)
		} else {
			next, marker = n, agentproto.MarkerToHost(nonce)
		}
		nextMu.Unlock()
		sess.Close()
	}
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			s.handle(st, suspend, handOver)
		}()
	}
	sess.Close()
	handlers.Wait()
	nextMu.Lock()
	defer nextMu.Unlock()
	if next != nil {
		if _, err := next.Write(marker); err != nil {
			return nil, fmt.Errorf("agent: hand over the session: %w", err)
		}
	}
	return next, nil
}

func newServer(cfg Config) (*server, error) {
	if cfg.Workdir == "" {
		cfg.Workdir = DefaultWorkdir
	}
	if cfg.DefaultMaxOutput <= 0 {
		cfg.DefaultMaxOutput = DefaultMaxOutput
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	s := &server{cfg: cfg, log: cfg.Logger, procs: make(map[string]*proc)}
	if cfg.Cgroup != nil {
		s.cgroups = newCgroupTree(cfg.Cgroup)
	}
	for _, kv := range cfg.Env {
		if !strings.HasPrefix(kv, markerEnv+"=") {
			s.env = append(s.env, kv)
		}
	}
	owner, aerr := s.owner("")
	if aerr != nil {
		return nil, fmt.Errorf("agent: default user: %s", aerr.Message)
	}
	if err := mkdirAll(cfg.Workdir, 0o755, owner); err != nil {
		return nil, fmt.Errorf("agent: workdir: %w", err)
	}
	getReaper()
	return s, nil
}

// shutdown kills every running process and waits until all are collected.
func (s *server) shutdown() {
	s.mu.Lock()
	s.closed = true
	var running []*proc
	for _, p := range s.procs {
		if !p.isDone() {
			running = append(running, p)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range running {
		wg.Go(func() { p.kill(reasonAbort) })
	}
	wg.Wait()
	s.runs.Wait()
}

// handle serves one stream: one request, one response. OpSuspend asks
// suspend whether the session can be, and calls handOver once it answered.
func (s *server) handle(st *yamux.Stream, suspend func(nonce []byte) *agentproto.Error, handOver func(nonce []byte)) {
	defer st.Close()
	kind, payload, err := agentproto.ReadFrame(st, nil)
	if err != nil {
		return
	}
	var req agentproto.Request
	if kind != agentproto.KindRequest {
		s.reply(st, &agentproto.Response{Error: errorf(agentproto.CodeBadRequest, "first frame must be a request")})
		return
	}
	if err := json.Unmarshal(payload, &req); err != nil {
		s.reply(st, &agentproto.Response{Error: errorf(agentproto.CodeBadRequest, "decode request: %v", err)})
		return
	}
	var resp *agentproto.Response
	switch req.Op {
	case agentproto.OpPing:
		resp = &agentproto.Response{}
	case agentproto.OpExec:
		resp = s.opExec(st, &req)
	case agentproto.OpStart:
		resp = s.opStart(&req)
	case agentproto.OpAttach:
		resp = s.opAttach(st, &req)
	case agentproto.OpRename:
		resp = s.opRename(&req)
	case agentproto.OpStdin:
		resp = s.opStdin(st, &req)
	case agentproto.OpWait:
		resp = s.opWait(st, &req)
	case agentproto.OpSignal:
		resp = s.opSignal(&req)
	case agentproto.OpList:
		resp = s.opList()
	case agentproto.OpWriteFile:
		resp = s.opWriteFile(st, &req)
	case agentproto.OpReadFile:
		resp = s.opReadFile(st, &req)
	case agentproto.OpStat:
		resp = s.opStat(&req)
	case agentproto.OpListDir:
		resp = s.opListDir(&req)
	case agentproto.OpMkdir:
		resp = s.opMkdir(&req)
	case agentproto.OpRemove:
		resp = s.opRemove(&req)
	case agentproto.OpConnect:
		resp = s.opConnect(st, &req)
	case agentproto.OpWatch:
		resp = s.opWatch(st, &req)
	case agentproto.OpSuspend:
		if e := suspend(req.Nonce); e != nil {
			resp = fail(e)
			break
		}
		// The answer is the marker (Handover): the host's session
		// stopped reading once the request was sent.
		handOver(req.Nonce)
		return
	default:
		resp = &agentproto.Response{Error: errorf(agentproto.CodeBadRequest, "unknown op %q", req.Op)}
	}
	if resp != nil {
		s.reply(st, resp)
	}
}

// reply writes the final response frame. A failure means the host is gone:
// there is nobody to tell.
func (s *server) reply(st *yamux.Stream, resp *agentproto.Response) {
	_ = agentproto.WriteJSON(st, agentproto.KindResponse, resp)
}

// fail is a response carrying err.
func fail(err *agentproto.Error) *agentproto.Response {
	return &agentproto.Response{Error: err}
}

// owner resolves the user that owns created files: spec, or the default
// user; nil means the agent's own user (no chown).
func (s *server) owner(spec string) (*identity, *agentproto.Error) {
	if spec == "" {
		spec = s.cfg.User
	}
	if spec == "" {
		return nil, nil
	}
	id, err := lookupUser(spec)
	if err != nil {
		return nil, errorf(agentproto.CodeBadRequest, "%v", err)
	}
	return id, nil
}

// watchPeer watches the host side of a stream on which the host sends
// nothing more: gone is closed when the host closes it (or the session
// dies), and any blocked write is then released. stop must be called once
// the handler has written its last frame; it waits for the watcher to end.
func watchPeer(st *yamux.Stream) (gone <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		var buf [512]byte
		for {
			if _, err := st.Read(buf[:]); err != nil {
				break
			}
		}
		close(ch)
		st.SetWriteDeadline(time.Now())
	}()
	return ch, func() {
		st.SetReadDeadline(time.Now())
		<-exited
	}
}

// register adds a running process to the table and to the runs the
// shutdown waits for (the caller calls s.runs.Done when it has collected
// it). It fails once the shutdown has begun.
func (s *server) register(p *proc) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.procs[p.id] = p
	s.runs.Add(1)
	return true
}

// unregister removes a foreground process from the table.
func (s *server) unregister(p *proc) {
	s.mu.Lock()
	delete(s.procs, p.id)
	s.mu.Unlock()
}

// retire records a finished background process and forgets the oldest
// ones beyond the limits.
func (s *server) retire(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs[p.id] = p
	s.finished = append(s.finished, p)
	s.retained += p.out.size()
	for len(s.finished) > 1 && (len(s.finished) > maxFinished || s.retained > maxRetainedOutput) {
		old := s.finished[0]
		s.finished[0] = nil
		s.finished = s.finished[1:]
		s.retained -= old.out.size()
		delete(s.procs, old.id)
	}
}

// lookup finds a process by id.
func (s *server) lookup(id string) (*proc, *agentproto.Error) {
	s.mu.Lock()
	p := s.procs[id]
	s.mu.Unlock()
	if p == nil {
		return nil, errorf(agentproto.CodeNotFound, "no process %q", id)
	}
	return p, nil
}

// opList lists running processes and finished background ones, oldest
// first.
func (s *server) opList() *agentproto.Response {
	s.mu.Lock()
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	slices.SortFunc(procs, func(a, b *proc) int {
		return cmp.Or(a.started.Compare(b.started), strings.Compare(a.id, b.id))
	})
	infos := make([]agentproto.ProcInfo, len(procs))
	for i, p := range procs {
		infos[i] = p.info()
	}
	return &agentproto.Response{Procs: infos}
}

// errClosed is returned when a process is requested after shutdown began.
var errClosed = errors.New("agent is shutting down")
