package agent

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/agentproto"
)

// pipeGrace is how long the output of a process that has exited is still
// read when something else (a daemon it started) keeps its pipes open.
const pipeGrace = 100 * time.Millisecond

// readChunk is the size of one read from a process's output pipe.
const readChunk = 64 << 10

// maxTimeoutMs is the largest timeout (a year) a request may ask for.
const maxTimeoutMs = 365 * 24 * 3600 * 1000

// pumpBufs holds the read buffers of output pumps.
var pumpBufs = sync.Pool{New: func() any {
	b := make([]byte, agentproto.HeaderSize+readChunk)
	return &b
}}

// defaultPath is PATH when the environment has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Why the agent killed a process tree.
const (
	reasonNone int32 = iota
	reasonTimeout
	reasonAbort  // the host went away or the agent is shutting down
	reasonKilled // the host sent SIGKILL: the whole tree goes
	reasonOutput // past its output cap (KillOnOutputLimit)
	reasonMemory // past its memory limit (MemoryLimitBytes)
)

// proc is a process started by the agent (foreground or background).
type proc struct {
	id      string
	pid     int
	argv    []string
	tag     string
	started time.Time
	marker  []byte // markerEnv=id and NUL, as found in /proc/pid/environ
	waitCh  <-chan waitResult

	// Pipes: the agent's ends. stdin is nil when the process reads
	// /dev/null.
	stdin, stdout, stderr *os.File
	// stdinMu guards a background process's stdin: OpStdin writes to it
	// and closes it; the process's end closes it too.
	stdinMu sync.Mutex

	reason   atomic.Int32 // first kill reason
	killOnce sync.Once
	killDone chan struct{} // closed when killTree has finished

	done chan struct{} // closed once exit is set
	exit agentproto.ExitInfo

	out *outLog // background processes only

	cg *procCgroup // its cgroup, when the agent has a delegated one
}

// kill kills the process tree for reason (the first reason is kept) and
// returns when no member is left.
func (p *proc) kill(reason int32) {
	p.reason.CompareAndSwap(reasonNone, reason)
	p.killOnce.Do(func() {
		if p.cg != nil {
			p.cg.kill(time.Now().Add(killTreeBudget))
		}
		// Without a cgroup, or should a member have escaped it: the scan.
		killTree(p.pid, p.marker)
		close(p.killDone)
	})
	<-p.killDone
}

func (p *proc) isDone() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// info describes the process.
func (p *proc) info() agentproto.ProcInfo {
	pi := agentproto.ProcInfo{ID: p.id, Pid: p.pid, Argv: p.argv, Tag: p.tag, StartedAt: p.started, Running: true}
	if p.isDone() {
		exit := p.exit
		pi.Running = false
		pi.Exit = &exit
	}
	return pi
}

// newID returns a random process id.
func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// spawn starts the process req describes. It returns a protocol error for
// a malformed request; a process that cannot start is returned done, with
// StatusError.
func (s *server) spawn(req *agentproto.ExecRequest, withStdin bool) (*proc, *agentproto.Error) {
	if req == nil {
		return nil, errorf(agentproto.CodeBadRequest, "missing exec")
	}
	argv := req.Argv
	switch {
	case len(argv) > 0 && req.Shell != "":
		return nil, errorf(agentproto.CodeBadRequest, "argv and shell are exclusive")
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	case len(argv) == 0 || argv[0] == "":
		return nil, errorf(agentproto.CodeBadRequest, "argv or shell is required")
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, errorf(agentproto.CodeBadRequest, "argv contains a NUL byte")
		}
	}
	if req.TimeoutMs < 0 || req.TimeoutMs > maxTimeoutMs || req.MaxOutputBytes < 0 || req.MemoryLimitBytes < 0 {
		return nil, errorf(agentproto.CodeBadRequest, "timeout, output cap or memory limit out of range")
	}
	id := newID()
	p := &proc{
		id: id, argv: argv, tag: req.Tag, started: time.Now(),
		marker:   []byte(markerEnv + "=" + id + "\x00"),
		killDone: make(chan struct{}),
		done:     make(chan struct{}),
	}

	var ident *identity
	userSpec := cmp.Or(req.User, s.cfg.User)
	if userSpec != "" {
		var err error
		if ident, err = lookupUser(userSpec); err != nil {
			return p.failed(err), nil
		}
	}
	env, perr := s.buildEnv(req.Env, ident, p.marker)
	if perr != nil {
		return nil, perr
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = s.cfg.Workdir
	} else if !path.IsAbs(cwd) {
		cwd = path.Join(s.cfg.Workdir, cwd)
	}
	if err := checkDir(cwd); err != nil {
		return p.failed(err), nil
	}
	exe, err := lookPath(argv[0], env, cwd)
	if err != nil {
		return p.failed(err), nil
	}

	// Pipes: the child's ends are plain blocking fds; the agent's ends
	// are non-blocking so that reads use the poller and can be cut short
	// with a deadline.
	var files [3]uintptr
	var childEnds []int
	defer func() {
		for _, fd := range childEnds {
			syscall.Close(fd)
		}
	}()
	pipe := func(parentReads bool) (*os.File, int, error) {
		var fds [2]int
		if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
			return nil, 0, err
		}
		parent, child := fds[0], fds[1]
		if !parentReads {
			parent, child = child, parent
		}
		childEnds = append(childEnds, child)
		syscall.SetNonblock(parent, true)
		return os.NewFile(uintptr(parent), "|"+id), child, nil
	}
	closeAll := func() {
		for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
			if f != nil {
				f.Close()
			}
		}
	}
	if withStdin {
		f, fd, err := pipe(false)
		if err != nil {
			return p.failed(err), nil
		}
		p.stdin, files[0] = f, uintptr(fd)
	} else {
		null, err := devNull()
		if err != nil {
			return p.failed(err), nil
		}
		files[0] = null
	}
	for i, dst := range []**os.File{&p.stdout, &p.stderr} {
		f, fd, err := pipe(true)
		if err != nil {
			closeAll()
			return p.failed(err), nil
		}
		*dst, files[i+1] = f, uintptr(fd)
	}

	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: files[:],
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	if ident != nil {
		attr.Sys.Credential = ident.credential()
	}
	if s.cgroups != nil {
		// Born in its own cgroup: nothing it starts can leave it.
		cg, err := s.cgroups.create(id)
		if err != nil {
			closeAll()
			return p.failed(fmt.Errorf("start %s: %w", exe, err)), nil
		}
		p.cg = cg
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = true, cg.descriptor()
	}
	pid, waitCh, err := getReaper().start(func() (int, error) {
		return syscall.ForkExec(exe, argv, attr)
	})
	if err != nil {
		closeAll()
		if p.cg != nil {
			p.cg.release()
		}
		return p.failed(fmt.Errorf("start %s: %w", exe, err)), nil
	}
	p.pid, p.waitCh = pid, waitCh
	return p, nil
}

// failed marks p as a process that could not start.
func (p *proc) failed(err error) *proc {
	p.exit = agentproto.ExitInfo{Status: agentproto.StatusError, ExitCode: -1, Error: err.Error()}
	close(p.done)
	return p
}

var (
	devNullOnce sync.Once
	devNullFD   uintptr
	devNullErr  error
)

// devNull returns a descriptor of /dev/null shared by all processes
// started without stdin.
func devNull() (uintptr, error) {
	devNullOnce.Do(func() {
		fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		devNullFD, devNullErr = uintptr(fd), err
	})
	return devNullFD, devNullErr
}

// buildEnv returns the environment of a process: the base environment,
// then the user's HOME, USER and LOGNAME, then the request's variables
// (later ones win), and last the marker.
func (s *server) buildEnv(extra map[string]string, ident *identity, marker []byte) ([]string, *agentproto.Error) {
	mark := string(marker[:len(marker)-1])
	if len(extra) == 0 && ident == nil {
		return append(s.env[:len(s.env):len(s.env)], mark), nil
	}
	set := make(map[string]string, len(extra)+3)
	if ident != nil {
		set["HOME"], set["USER"], set["LOGNAME"] = ident.home, ident.name, ident.name
	}
	for k, v := range extra {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return nil, errorf(agentproto.CodeBadRequest, "invalid environment variable name or value")
		}
		if k == markerEnv {
			continue
		}
		set[k] = v
	}
	env := make([]string, 0, len(s.env)+len(set)+1)
	for _, kv := range s.env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+set[k])
	}
	return append(env, mark), nil
}

// checkDir reports a working directory that does not exist (or is not a
// directory) with a clearer message than the failed chdir in the child.
func checkDir(dir string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return fmt.Errorf("working directory %s: %w", dir, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return fmt.Errorf("working directory %s: %w", dir, syscall.ENOTDIR)
	}
	return nil
}

// lookPath finds the executable file like a shell would, with the PATH of
// the process's environment; a name with a slash is used as is (relative
// to the process's working directory).
func lookPath(file string, env []string, cwd string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	pathEnv := defaultPath
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			pathEnv = v
			break
		}
	}
	for dir := range strings.SplitSeq(pathEnv, ":") {
		if dir == "" {
			dir = "."
		}
		if !path.IsAbs(dir) {
			dir = path.Join(cwd, dir)
		}
		var st syscall.Stat_t
		p := dir + "/" + file
		if syscall.Stat(p, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG && st.Mode&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", file)
}

// sink receives the kept output of one stream of a process. buf holds
// agentproto.HeaderSize free bytes, then the data.
type sink interface {
	output(kind byte, buf []byte, n int)
}

// pump copies one output pipe to a sink until EOF (or a deadline), keeping
// at most limit bytes. It counts the bytes it reads in *read and sets
// *truncated when it drops some, then calls over (if set) once.
func pump(f *os.File, kind byte, limit int64, to sink, read *atomic.Int64, truncated *bool, over func(), done chan<- struct{}) {
	bufp := pumpBufs.Get().(*[]byte)
	defer func() {
		pumpBufs.Put(bufp)
		done <- struct{}{}
	}()
	buf := *bufp
	var kept int64
	for {
		n, err := f.Read(buf[agentproto.HeaderSize:])
		if n > 0 {
			read.Add(int64(n))
			keep := min(int64(n), limit-kept)
			if keep < int64(n) && !*truncated {
				*truncated = true
				if over != nil {
					over()
				}
			}
			if keep > 0 {
				kept += keep
				to.output(kind, buf, int(keep))
			}
		}
		if err != nil {
			return
		}
	}
}

// run supervises a started process until it ends and its output is read:
// it enforces the timeout, and returns how the process ended.
func (s *server) run(p *proc, req *agentproto.ExecRequest, to sink) agentproto.ExitInfo {
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = s.cfg.DefaultMaxOutput
	}
	var exit agentproto.ExitInfo
	var read [2]atomic.Int64
	pumped := make(chan struct{}, 2)
	var over func()
	if req.KillOnOutputLimit {
		over = func() { p.killFor(reasonOutput) }
	}
	go pump(p.stdout, agentproto.KindStdout, limit, to, &read[0], &exit.StdoutTruncated, over, pumped)
	go pump(p.stderr, agentproto.KindStderr, limit, to, &read[1], &exit.StderrTruncated, over, pumped)

	var timer *time.Timer
	if req.TimeoutMs > 0 {
		timer = time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() { p.kill(reasonTimeout) })
	}
	var peak chan int64
	exited := make(chan struct{})
	if req.MemoryLimitBytes > 0 {
		peak = make(chan int64, 1)
		go func() { peak <- p.watchMemory(req.MemoryLimitBytes, exited) }()
	}
	res := <-p.waitCh
	close(exited)
	exit.DurationMs = time.Since(p.started).Milliseconds()
	if peak != nil {
		exit.PeakMemoryBytes = <-peak
	}
	if (timer != nil && !timer.Stop()) || p.reason.Load() != reasonNone {
		// Killing is under way: let it finish, so that no member holds
		// the pipes or outlives the answer.
		<-p.killDone
	}

	drain([2]*os.File{p.stdout, p.stderr}, &read, pumped)
	p.stdout.Close()
	p.stderr.Close()

	ws := res.status
	switch {
	case res.err != nil:
		exit.Status, exit.ExitCode, exit.Error = agentproto.StatusError, -1, "collect exit status: "+res.err.Error()
	case p.reason.Load() == reasonTimeout:
		exit.Status, exit.ExitCode = agentproto.StatusTimedOut, -1
		if ws.Signaled() {
			exit.Signal = int(ws.Signal())
		}
	case p.reason.Load() == reasonOutput || p.reason.Load() == reasonMemory:
		// Killed by the agent for a limit, even should it have exited on
		// its own in the meantime: the limit was passed.
		exit.Status, exit.ExitCode, exit.Signal = agentproto.StatusKilled, -1, int(syscall.SIGKILL)
		exit.OutputLimitExceeded = p.reason.Load() == reasonOutput
		exit.MemoryLimitExceeded = p.reason.Load() == reasonMemory
	case ws.Exited():
		exit.Status, exit.ExitCode = agentproto.StatusExited, ws.ExitStatus()
	default:
		exit.Status, exit.ExitCode, exit.Signal = agentproto.StatusKilled, -1, int(ws.Signal())
	}
	return exit
}

// discard kills a process that started while the agent was shutting down
// and collects it.
func (p *proc) discard() {
	p.kill(reasonAbort)
	<-p.waitCh
	if p.cg != nil {
		p.cg.release()
	}
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// drain waits for the pumps of a process that has exited. Without other
// writers its pipes reach EOF once read. A daemon it started may keep them
// open: after pipeGrace, a pipe's reading stops as soon as it is empty
// (all the process wrote has been read, even if forwarding it was slow),
// or once a whole pipe buffer more has been read (the daemon keeps
// writing).
func drain(pipes [2]*os.File, read *[2]atomic.Int64, pumped <-chan struct{}) {
	// A pump may hold a chunk it has read and not yet counted: the bound
	// is a whole pipe buffer past that too.
	var bound [2]int64
	for i, f := range pipes {
		bound[i] = read[i].Load() + readChunk + pipeCapacity(f)
	}
	var cut [2]bool
	timer := time.NewTimer(pipeGrace)
	defer timer.Stop()
	for running := 2; running > 0; {
		select {
		case <-pumped:
			running--
		case <-timer.C:
			again := false
			for i, f := range pipes {
				if cut[i] {
					continue
				}
				if pipeBuffered(f) == 0 || read[i].Load() >= bound[i] {
					f.SetReadDeadline(time.Now())
					cut[i] = true
				} else {
					again = true
				}
			}
			if again {
				timer.Reset(pipeGrace / 10)
			}
		}
	}
}

// pipeCapacity is the buffer size of pipe f.
func pipeCapacity(f *os.File) int64 {
	size := int64(64 << 10)
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if n, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0); err == nil {
				size = int64(n)
			}
		})
	}
	return size
}

// pipeBuffered is the number of bytes waiting in pipe f (0 if unknown).
func pipeBuffered(f *os.File) int {
	n := 0
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
		})
	}
	return n
}

// finish publishes how p ended, and lets its cgroup go (kept while
// daemons it left on its own still run in it).
func (p *proc) finish(exit agentproto.ExitInfo) {
	p.exit = exit
	close(p.done)
	if p.cg != nil {
		p.cg.release()
	}
}

// streamSink forwards output to the host as frames as soon as it is read.
// After a failed write (the host is gone) output is only drained.
type streamSink struct {
	st     *yamux.Stream
	broken atomic.Bool
}

func (w *streamSink) output(kind byte, buf []byte, n int) {
	if w.broken.Load() {
		return
	}
	agentproto.PutHeader(buf, kind, n)
	if _, err := w.st.Write(buf[:agentproto.HeaderSize+n]); err != nil {
		w.broken.Store(true)
	}
}

// opExec runs a foreground process, streaming its output on st.
func (s *server) opExec(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	p, perr := s.spawn(req.Exec, req.Exec != nil && req.Exec.Stdin)
	if perr != nil {
		return fail(perr)
	}
	if p.isDone() {
		return &agentproto.Response{Exit: &p.exit}
	}
	if !s.register(p) {
		p.discard()
		return fail(errorf(agentproto.CodeInternal, "%v", errClosed))
	}
	defer s.runs.Done()
	defer s.unregister(p)
	s.log.Debug("exec started", "id", p.id, "pid", p.pid)

	inputDone := make(chan struct{})
	go s.execInput(st, p, inputDone)
	exit := s.run(p, req.Exec, &streamSink{st: st})
	p.finish(exit)
	s.log.Debug("exec ended", "id", p.id, "status", exit.Status, "duration_ms", exit.DurationMs)

	s.reply(st, &agentproto.Response{Exit: &exit})
	// Release the input reader, which may be blocked on the stream or on
	// a stdin pipe that a daemon keeps open.
	st.SetReadDeadline(time.Now())
	if p.stdin != nil {
		p.stdin.SetWriteDeadline(time.Now())
	}
	<-inputDone
	return nil
}

// execInput handles the host's frames during an exec: stdin, its end, and
// signals. If the host goes away before the process has ended, the
// process tree is killed.
func (s *server) execInput(st *yamux.Stream, p *proc, done chan<- struct{}) {
	defer close(done)
	stdin := p.stdin
	defer func() {
		if stdin != nil {
			stdin.Close()
		}
	}()
	var buf []byte
	for {
		kind, payload, err := agentproto.ReadFrame(st, buf)
		if err != nil {
			if !p.isDone() {
				p.kill(reasonAbort)
			}
			return
		}
		if cap(payload) > cap(buf) {
			buf = payload
		}
		switch kind {
		case agentproto.KindStdin:
			if stdin != nil {
				// A failed write (the process closed its stdin) drops the
				// data; frames keep being read for signals.
				if _, err := stdin.Write(payload); err != nil {
					stdin.Close()
					stdin = nil
				}
			}
		case agentproto.KindStdinClose:
			if stdin != nil {
				stdin.Close()
				stdin = nil
			}
		case agentproto.KindSignal:
			var sr agentproto.SignalRequest
			if json.Unmarshal(payload, &sr) == nil && validSignal(sr.Signal) {
				p.signal(syscall.Signal(sr.Signal))
			}
		}
	}
}

func validSignal(sig int) bool { return sig > 0 && sig <= 64 }

// opStart starts a background process; its output goes to its log. With
// Exec.Stdin its stdin is a pipe that OpStdin writes to and closes.
func (s *server) opStart(req *agentproto.Request) *agentproto.Response {
	p, perr := s.spawn(req.Exec, req.Exec != nil && req.Exec.Stdin)
	if perr != nil {
		return fail(perr)
	}
	p.out = newOutLog()
	if p.isDone() {
		p.out.close()
		s.retire(p)
		pi := p.info()
		return &agentproto.Response{Proc: &pi}
	}
	if !s.register(p) {
		p.discard()
		return fail(errorf(agentproto.CodeInternal, "%v", errClosed))
	}
	s.log.Debug("process started", "id", p.id, "pid", p.pid)
	pi := p.info()
	go func() {
		defer s.runs.Done()
		exit := s.run(p, req.Exec, p.out)
		p.closeStdin()
		p.out.close()
		p.finish(exit)
		s.retire(p)
		s.log.Debug("process ended", "id", p.id, "status", exit.Status, "duration_ms", exit.DurationMs)
	}()
	return &agentproto.Response{Proc: &pi}
}

// stdinWriteTimeout bounds a write to a background process's stdin: a
// process that does not read it fails the write instead of holding the
// host's call.
const stdinWriteTimeout = 30 * time.Second

// writeStdin writes b to a background process's stdin.
func (p *proc) writeStdin(b []byte) *agentproto.Error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		if p.isDone() {
			return errorf(agentproto.CodeNotFound, "process %s has ended", p.id)
		}
		return errorf(agentproto.CodeBadRequest, "process %s has no stdin (started without it, or it was closed)", p.id)
	}
	p.stdin.SetWriteDeadline(time.Now().Add(stdinWriteTimeout))
	if _, err := p.stdin.Write(b); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errorf(agentproto.CodeExists, "process %s did not read its stdin for %s", p.id, stdinWriteTimeout)
		}
		// It closed its stdin, or ended.
		p.stdin.Close()
		p.stdin = nil
		return errorf(agentproto.CodeBadRequest, "process %s no longer reads its stdin: %v", p.id, err)
	}
	return nil
}

// closeStdin closes a background process's stdin (its read sees EOF).
func (p *proc) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

// opStdin writes the host's KindStdin frames to a background process's
// stdin and closes it on KindStdinClose, until the host's KindEnd.
func (s *server) opStdin(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	p, perr := s.lookup(req.ProcID)
	if perr != nil {
		return fail(perr)
	}
	if p.out == nil {
		return fail(errorf(agentproto.CodeBadRequest, "process %q is a foreground exec", req.ProcID))
	}
	bufp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bufp)
	buf := (*bufp)[:agentproto.MaxFrame]
	for {
		kind, n, err := agentproto.ReadHeader(st)
		if err != nil {
			return nil // the host went away
		}
		if _, err := io.ReadFull(st, buf[:n]); err != nil {
			return nil
		}
		switch kind {
		case agentproto.KindStdin:
			if e := p.writeStdin(buf[:n]); e != nil {
				return fail(e)
			}
		case agentproto.KindStdinClose:
			p.closeStdin()
		case agentproto.KindEnd:
			return &agentproto.Response{}
		default:
			return fail(errorf(agentproto.CodeBadRequest, "unexpected frame %q during stdin", kind))
		}
	}
}

// opAttach replays a background process's output, follows it, and ends
// with its exit. The host closing the stream only detaches.
func (s *server) opAttach(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	p, perr := s.lookup(req.ProcID)
	if perr != nil {
		return fail(perr)
	}
	if p.out == nil {
		return fail(errorf(agentproto.CodeBadRequest, "process %q is a foreground exec", req.ProcID))
	}
	gone, stop := watchPeer(st)
	defer stop()
	off := 0
	for {
		data, changed, closed := p.out.snapshot(off)
		if len(data) > 0 {
			if _, err := st.Write(data); err != nil {
				return nil
			}
			off += len(data)
			continue
		}
		if closed {
			<-p.done
			return &agentproto.Response{Exit: &p.exit}
		}
		select {
		case <-changed:
		case <-gone:
			return nil
		}
	}
}

// opWait waits for a process to end.
func (s *server) opWait(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	p, perr := s.lookup(req.ProcID)
	if perr != nil {
		return fail(perr)
	}
	gone, stop := watchPeer(st)
	defer stop()
	select {
	case <-p.done:
		return &agentproto.Response{Exit: &p.exit}
	case <-gone:
		return nil
	}
}

// signal sends sig to the process group; SIGKILL kills the whole tree,
// including descendants that left the group.
func (p *proc) signal(sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		go p.kill(reasonKilled)
		return nil
	}
	return syscall.Kill(-p.pid, sig)
}

// opSignal signals a process (see proc.signal). Signalling a process that
// has ended is not an error: there is nothing left to signal.
func (s *server) opSignal(req *agentproto.Request) *agentproto.Response {
	if !validSignal(req.Signal) {
		return fail(errorf(agentproto.CodeBadRequest, "invalid signal %d", req.Signal))
	}
	p, perr := s.lookup(req.ProcID)
	if perr != nil {
		return fail(perr)
	}
	if p.isDone() {
		return &agentproto.Response{}
	}
	if err := p.signal(syscall.Signal(req.Signal)); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fail(errorf(agentproto.CodeInternal, "process %q: %v", req.ProcID, err))
	}
	return &agentproto.Response{}
}

// outLog is the kept output of a background process: its frames, in the
// order they were read, ready to be written to an attached host as is.
type outLog struct {
	mu        sync.Mutex
	buf       []byte
	lastStart int  // offset of the last frame; -1 if none
	sealed    int  // bytes handed out; frames before it never change
	closed    bool // no more output
	changed   chan struct{}
}

func newOutLog() *outLog { return &outLog{lastStart: -1} }

// maxCoalesce bounds the payload of a frame grown by coalescing.
const maxCoalesce = 64 << 10

// output appends data; a small read is merged into the previous frame of
// the same stream when no attacher has seen that frame yet.
func (l *outLog) output(kind byte, buf []byte, n int) {
	data := buf[agentproto.HeaderSize : agentproto.HeaderSize+n]
	l.mu.Lock()
	defer l.mu.Unlock()
	if last := l.lastStart; last >= 0 && last >= l.sealed && l.buf[last] == kind &&
		len(l.buf)-last-agentproto.HeaderSize+n <= maxCoalesce {
		l.buf = append(l.buf, data...)
		agentproto.PutHeader(l.buf[last:], kind, len(l.buf)-last-agentproto.HeaderSize)
	} else {
		l.lastStart = len(l.buf)
		l.buf = agentproto.AppendFrame(l.buf, kind, data)
	}
	l.notify()
}

func (l *outLog) notify() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// close marks the end of the output.
func (l *outLog) close() {
	l.mu.Lock()
	l.closed = true
	l.notify()
	l.mu.Unlock()
}

// snapshot returns the frames from offset off on, whether the log is
// complete, and, when there is nothing new yet, a channel closed on the
// next change. The returned bytes never change.
func (l *outLog) snapshot(off int) (data []byte, changed <-chan struct{}, closed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.buf)
	l.sealed = n
	data = l.buf[off:n:n]
	if len(data) == 0 && !l.closed {
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		changed = l.changed
	}
	return data, changed, l.closed
}

// size is the memory the log holds.
func (l *outLog) size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(len(l.buf))
}
