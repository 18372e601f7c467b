package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// ErrSessionClosed is wrapped by every error a Client returns because the
// connection to the agent is gone (the agent exited, the sandbox died, or
// Close was called). Callers test it with errors.Is to tell a dead sandbox
// from a failed call, which comes back as an *Error.
var ErrSessionClosed = errors.New("agentproto: session closed")

// ErrSuspended is wrapped by the error of a call that was in flight when
// the session was suspended (Suspend): the agent ended it (a foreground
// exec was killed, an attach or a watch cut), the sandbox lives on.
var ErrSuspended = errors.New("agentproto: session suspended")

// ChunkSize is the payload size of the data frames both sides send when
// streaming files.
const ChunkSize = 256 << 10

// YamuxConfig returns the yamux configuration both ends of the protocol
// use: large per-stream windows for throughput, no keepalive (an idle
// sandbox costs nothing; a dead one is noticed when its connection
// closes) and no logging.
func YamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.ConnectionWriteTimeout = 30 * time.Second
	cfg.StreamOpenTimeout = 0
	cfg.StreamCloseTimeout = time.Minute
	cfg.LogOutput = io.Discard
	return cfg
}

// Client is the host side of the protocol: one yamux session to one agent
// at a time (Suspend and Resume hand the connection over to a new one). It
// is safe for concurrent use; every call runs on its own stream.
type Client struct {
	mu   sync.Mutex
	ho   *Handover
	sess *yamux.Session
	// resumed is closed unless the session is suspended: calls opened
	// meanwhile wait for it.
	resumed chan struct{}
	// parked is closed by Park: calls waiting for the resume fail.
	parked chan struct{}
	nonce  []byte // of the suspension in progress
	done   chan struct{}
	ended  bool // done is closed
}

// Dial starts a protocol session over conn, which the Client owns from now
// on (Close closes it). It does not wait for the agent: use Ping for that.
func Dial(conn io.ReadWriteCloser) (*Client, error) {
	c := &Client{ho: NewHandover(conn), done: make(chan struct{}), resumed: make(chan struct{})}
	close(c.resumed)
	if err := c.start(c.ho.Session()); err != nil {
		return nil, err
	}
	return c, nil
}

// start makes the yamux session over conn the client's (under c.mu, or
// before anyone else sees c).
func (c *Client) start(conn io.ReadWriteCloser) error {
	sess, err := yamux.Client(conn, YamuxConfig())
	if err != nil {
		return fmt.Errorf("agentproto: start session: %w", err)
	}
	c.sess = sess
	go func() {
		<-sess.CloseChan()
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.sess == sess && c.nonce == nil {
			c.endLocked()
		}
	}()
	return nil
}

func (c *Client) endLocked() {
	if !c.ended {
		c.ended = true
		close(c.done)
	}
}

// Close ends the session and closes the connection. Calls in flight fail
// with ErrSessionClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	c.endLocked()
	sess, ho := c.sess, c.ho
	c.mu.Unlock()
	err := sess.Close()
	// The connection too, also when the session was handed over (then
	// the session's Close left it open); closing it twice is no error.
	_ = ho.Close()
	return err
}

// Done is closed when the session ends: Close was called or the connection
// to the agent broke (not when a session is suspended).
func (c *Client) Done() <-chan struct{} {
	return c.done
}

// Err returns nil while the session is alive, and ErrSessionClosed after.
func (c *Client) Err() error {
	select {
	case <-c.done:
		return ErrSessionClosed
	default:
		return nil
	}
}

// session returns the current session, waiting while it is suspended.
func (c *Client) session(ctx context.Context) (*yamux.Session, error) {
	for {
		c.mu.Lock()
		sess, resumed, parked := c.sess, c.resumed, c.parked
		c.mu.Unlock()
		select {
		case <-resumed:
			return sess, nil
		default:
		}
		select {
		case <-resumed:
		case <-parked:
			return nil, ErrSuspended
		case <-c.done:
			return nil, ErrSessionClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Suspend ends the session with the agent so that the sandbox can be
// checkpointed: once it returns, the agent has no call in progress on the
// connection and waits for the next session, which Resume starts. Calls in
// flight fail (a foreground exec is killed, an attach or a watch is cut);
// calls opened before Resume wait for it. nonce (NonceSize random bytes)
// marks the handover; a restored copy of the sandbox needs it too
// (Redial). On error the client is unusable: close it.
func (c *Client) Suspend(ctx context.Context, nonce []byte) error {
	if len(nonce) != NonceSize {
		return fmt.Errorf("agentproto suspend: nonce of %d bytes, want %d", len(nonce), NonceSize)
	}
	sess, err := c.session(ctx)
	if err != nil {
		return fmt.Errorf("agentproto suspend: %w", err)
	}
	c.mu.Lock()
	if c.sess != sess || c.nonce != nil {
		c.mu.Unlock()
		return fmt.Errorf("agentproto suspend: already suspended")
	}
	c.nonce = append([]byte{}, nonce...)
	c.resumed, c.parked = make(chan struct{}), make(chan struct{})
	ho := c.ho
	c.mu.Unlock()
	// The session reads nothing more from now on (else it could take the
	// agent's marker for a frame): the agent answers with the marker, not
	// on the session. The request is on the wire once openOn returns (a
	// stream write returns once written).
	ho.Freeze()
	// A stuck agent (stopped by a signal from inside) must not hold the
	// caller past ctx: then the connection is closed, and the client is
	// unusable.
	done := make(chan error, 1)
	go func() {
		k, err := c.openOn(ctx, sess, &Request{Op: OpSuspend, Nonce: nonce})
		if err != nil {
			done <- err
			return
		}
		next, err := ho.Next(nil, MarkerToHost(nonce))
		k.stop()
		_ = sess.Close()
		if err == nil {
			err = next.Sync()
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = ho.Close()
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("agentproto suspend: %w", err)
	}
	return nil
}

// Park makes the calls that wait for the suspended session's resume, and
// those made until it, fail at once with ErrSuspended: for a suspension
// that lasts (a pause), rather than calls that wait for hours.
func (c *Client) Park() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nonce != nil {
		select {
		case <-c.parked:
		default:
			close(c.parked)
		}
	}
}

// Resume starts the next session after Suspend: on the same connection
// (conn nil: the sandbox kept running) or on conn, a restored sandbox's
// new connection to the same agent, which the Client owns from now on
// (the old one is closed).
func (c *Client) Resume(conn io.ReadWriteCloser) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nonce == nil {
		return errors.New("agentproto resume: not suspended")
	}
	if c.ended {
		if conn != nil {
			conn.Close()
		}
		return fmt.Errorf("agentproto resume: %w", ErrSessionClosed)
	}
	if conn != nil {
		_ = c.ho.Close()
		c.ho = NewHandover(conn)
	}
	next, err := c.ho.Next(MarkerToAgent(c.nonce), nil)
	if err != nil {
		return fmt.Errorf("agentproto resume: %w", err)
	}
	if err := c.start(next); err != nil {
		return err
	}
	c.nonce = nil
	close(c.resumed)
	return nil
}

// Redial starts a session with the agent of a sandbox restored from a
// checkpoint taken after Suspend(nonce), over conn (its new connection).
func Redial(conn io.ReadWriteCloser, nonce []byte) (*Client, error) {
	c := &Client{ho: NewHandover(conn), done: make(chan struct{}), resumed: make(chan struct{})}
	close(c.resumed)
	next, err := c.ho.Next(MarkerToAgent(nonce), nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("agentproto redial: %w", err)
	}
	if err := c.start(next); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// call is one stream of one operation.
type call struct {
	c    *Client
	op   string
	ctx  context.Context
	st   *yamux.Stream
	sess *yamux.Session // st's
	stop func() bool    // unregisters the context watcher
}

// open opens a stream for req and sends the request frame. The stream is
// torn down (deadlines passed, closed) when ctx is done before finish.
func (c *Client) open(ctx context.Context, req *Request) (*call, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("agentproto %s: %w", req.Op, err)
	}
	sess, err := c.session(ctx)
	if err != nil {
		return nil, fmt.Errorf("agentproto %s: %w", req.Op, err)
	}
	return c.openOn(ctx, sess, req)
}

// openOn is open on session sess.
func (c *Client) openOn(ctx context.Context, sess *yamux.Session, req *Request) (*call, error) {
	st, err := sess.OpenStream()
	if err != nil {
		return nil, c.wrapOn(ctx, sess, req.Op, err)
	}
	k := &call{c: c, op: req.Op, ctx: ctx, st: st, sess: sess}
	k.stop = context.AfterFunc(ctx, func() {
		st.SetDeadline(time.Now())
		st.Close()
	})
	if err := WriteJSON(st, KindRequest, req); err != nil {
		k.finish()
		return nil, c.wrapOn(ctx, sess, req.Op, err)
	}
	return k, nil
}

// finish releases the stream. The agent sees the close; if it has not
// answered yet it aborts the operation (an exec is killed).
func (k *call) finish() {
	k.stop()
	k.st.Close()
}

// err wraps a transport error of this call.
func (k *call) err(err error) error {
	return k.c.wrapOn(k.ctx, k.sess, k.op, err)
}

// wrap turns a stream or session error into the error a caller sees:
// the context's error if it is done, ErrSessionClosed if the session died.
func (c *Client) wrap(ctx context.Context, op string, err error) error {
	return c.wrapOn(ctx, nil, op, err)
}

// wrapOn is wrap for an error of a call on session sess (nil: none yet).
func (c *Client) wrapOn(ctx context.Context, sess *yamux.Session, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("agentproto %s: %w", op, ctxErr)
	}
	if sess != nil && sess.IsClosed() {
		// Ended by a suspend (its session was replaced or is being), or
		// by the agent going away (the client may not know yet).
		c.mu.Lock()
		suspended := !c.ended && (c.nonce != nil || c.sess != sess)
		c.mu.Unlock()
		if suspended {
			return fmt.Errorf("agentproto %s: %w: %w", op, ErrSuspended, err)
		}
		return fmt.Errorf("agentproto %s: %w: %w", op, ErrSessionClosed, err)
	}
	if c.Err() != nil {
		return fmt.Errorf("agentproto %s: %w: %w", op, ErrSessionClosed, err)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("agentproto %s: %w", op, err)
}

// decodeResponse decodes a KindResponse payload; a response carrying an
// Error is returned as that *Error.
func decodeResponse(payload []byte) (*Response, error) {
	var resp Response
	if err := json.Unmarshal(payload, &resp); err != nil {
		return nil, fmt.Errorf("decode response: %w", err)
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	return &resp, nil
}

// readResponse reads frames until the response. Output frames go to
// stdout and stderr (nil discards them); a writer error aborts the call.
func (k *call) readResponse(stdout, stderr io.Writer) (*Response, error) {
	var buf []byte
	for {
		kind, payload, err := ReadFrame(k.st, buf)
		if err != nil {
			return nil, k.err(err)
		}
		if cap(payload) > cap(buf) {
			buf = payload
		}
		switch kind {
		case KindResponse:
			resp, err := decodeResponse(payload)
			var perr *Error
			if err != nil && !errors.As(err, &perr) {
				return nil, k.err(err)
			}
			return resp, err
		case KindStdout, KindStderr:
			w := stdout
			if kind == KindStderr {
				w = stderr
			}
			if w == nil {
				continue
			}
			if _, err := w.Write(payload); err != nil {
				return nil, fmt.Errorf("agentproto %s: write output: %w", k.op, err)
			}
		default:
			return nil, k.err(fmt.Errorf("unexpected frame kind %q", kind))
		}
	}
}

// roundTrip runs an operation that has no frames besides request and
// response.
func (c *Client) roundTrip(ctx context.Context, req *Request) (*Response, error) {
	k, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	defer k.finish()
	return k.readResponse(nil, nil)
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.roundTrip(ctx, &Request{Op: OpPing})
	return err
}

// Exec runs a process in the foreground and returns how it ended. Its
// output is written to stdout and stderr (nil discards) as it arrives;
// stdin, if not nil, is copied to the process, then its stdin is closed.
// When ctx is done before the process ends, the agent kills the whole
// process tree and Exec returns ctx's error. A process that cannot start
// is not an error: it ends with StatusError. A failed call returns an
// *Error; a lost agent an error wrapping ErrSessionClosed.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (ExitInfo, error) {
	e, err := c.OpenExec(ctx, req, stdin, stdout, stderr)
	if err != nil {
		return ExitInfo{}, err
	}
	return e.Wait()
}

// Execution is a foreground process started with OpenExec.
type Execution struct {
	k              *call
	stdout, stderr io.Writer
	stdinDone      chan struct{} // closed when Wait returns
}

// OpenExec starts a foreground process like Exec but returns at once, so
// that the caller can Signal it; Wait must be called to read its output
// and end. ctx governs the whole execution.
func (c *Client) OpenExec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*Execution, error) {
	req.Stdin = stdin != nil
	k, err := c.open(ctx, &Request{Op: OpExec, Exec: &req})
	if err != nil {
		return nil, err
	}
	e := &Execution{k: k, stdout: stdout, stderr: stderr, stdinDone: make(chan struct{})}
	if stdin != nil {
		go e.copyStdin(stdin)
	}
	return e, nil
}

// copyStdin sends stdin as KindStdin frames, then KindStdinClose. It stops
// at the first error, or when Wait has returned (a reader blocked in Read
// keeps this goroutine until the Read returns).
func (e *Execution) copyStdin(r io.Reader) {
	buf := make([]byte, HeaderSize+64<<10)
	for {
		n, err := r.Read(buf[HeaderSize:])
		select {
		case <-e.stdinDone:
			return
		default:
		}
		if n > 0 {
			PutHeader(buf, KindStdin, n)
			if _, werr := e.k.st.Write(buf[:HeaderSize+n]); werr != nil {
				return
			}
		}
		if err != nil {
			// EOF or a failed reader: either way the process sees the end
			// of its input.
			_ = WriteFrame(e.k.st, KindStdinClose, nil)
			return
		}
	}
}

// Signal sends sig (e.g. 15) to the process group of the execution.
func (e *Execution) Signal(sig int) error {
	if err := WriteJSON(e.k.st, KindSignal, SignalRequest{Signal: sig}); err != nil {
		return e.k.err(err)
	}
	return nil
}

// Wait streams the output until the process ends and returns how it
// ended. It must be called exactly once.
func (e *Execution) Wait() (ExitInfo, error) {
	defer close(e.stdinDone)
	defer e.k.finish()
	resp, err := e.k.readResponse(e.stdout, e.stderr)
	if err != nil {
		return ExitInfo{}, err
	}
	if resp.Exit == nil {
		return ExitInfo{}, e.k.err(errors.New("response without exit"))
	}
	return *resp.Exit, nil
}

// Start starts a background process and returns at once. Its output is
// kept by the agent (up to the output cap) for Attach. With req.Stdin its
// stdin stays open for WriteStdin.
func (c *Client) Start(ctx context.Context, req ExecRequest) (ProcInfo, error) {
	resp, err := c.roundTrip(ctx, &Request{Op: OpStart, Exec: &req})
	if err != nil {
		return ProcInfo{}, err
	}
	if resp.Proc == nil {
		return ProcInfo{}, c.wrap(ctx, OpStart, errors.New("response without proc"))
	}
	return *resp.Proc, nil
}

// Attach writes the output a background process produced so far, then
// follows it until the process ends, and returns how it ended. Ending ctx
// detaches without touching the process.
func (c *Client) Attach(ctx context.Context, id string, stdout, stderr io.Writer) (ExitInfo, error) {
	k, err := c.open(ctx, &Request{Op: OpAttach, ProcID: id})
	if err != nil {
		return ExitInfo{}, err
	}
	defer k.finish()
	resp, err := k.readResponse(stdout, stderr)
	if err != nil {
		return ExitInfo{}, err
	}
	if resp.Exit == nil {
		return ExitInfo{}, k.err(errors.New("response without exit"))
	}
	return *resp.Exit, nil
}

// Wait waits until a background process ends and returns how it ended.
func (c *Client) Wait(ctx context.Context, id string) (ExitInfo, error) {
	resp, err := c.roundTrip(ctx, &Request{Op: OpWait, ProcID: id})
	if err != nil {
		return ExitInfo{}, err
	}
	if resp.Exit == nil {
		return ExitInfo{}, c.wrap(ctx, OpWait, errors.New("response without exit"))
	}
	return *resp.Exit, nil
}

// Signal sends sig to the process group of a process started by Start.
func (c *Client) Signal(ctx context.Context, id string, sig int) error {
	_, err := c.roundTrip(ctx, &Request{Op: OpSignal, ProcID: id, Signal: sig})
	return err
}

// WriteStdin writes data to the stdin of a background process started
// with ExecRequest.Stdin, then closes its stdin if closeAfter. A process
// that ended, closed its stdin or does not read it fails the call with an
// *Error.
func (c *Client) WriteStdin(ctx context.Context, id string, data []byte, closeAfter bool) error {
	k, err := c.open(ctx, &Request{Op: OpStdin, ProcID: id})
	if err != nil {
		return err
	}
	defer k.finish()
	// The agent answers early when a write fails: read concurrently, and
	// stop sending when it does.
	done := make(chan error, 1)
	go func() {
		_, err := k.readResponse(nil, nil)
		done <- err
		k.st.SetWriteDeadline(time.Now())
	}()
	send := func() error {
		for len(data) > 0 {
			n := min(len(data), ChunkSize)
			if err := WriteFrame(k.st, KindStdin, data[:n]); err != nil {
				return err
			}
			data = data[n:]
		}
		if closeAfter {
			if err := WriteFrame(k.st, KindStdinClose, nil); err != nil {
				return err
			}
		}
		return WriteFrame(k.st, KindEnd, nil)
	}
	_ = send() // a failed send is the response's to explain
	return <-done
}

// List returns the processes the agent knows: running ones (foreground
// and background) and recently finished background ones, oldest first.
func (c *Client) List(ctx context.Context) ([]ProcInfo, error) {
	resp, err := c.roundTrip(ctx, &Request{Op: OpList})
	if err != nil {
		return nil, err
	}
	return resp.Procs, nil
}

// WriteOptions tunes WriteFile.
type WriteOptions struct {
	// Mode is the file's permission bits (0: keep those of the file it
	// replaces, or 0644).
	Mode uint32
	// Parents creates missing parent directories.
	Parents bool
	// MaxBytes refuses (CodeTooLarge) an upload longer than this; 0 = no
	// limit.
	MaxBytes int64
	// User owns the file and created parents ("" = the sandbox default
	// user).
	User string
}

// WriteFile streams r into the file at path (absolute). The file appears
// complete or not at all: the agent writes a temporary file next to it
// and renames it into place only after the last byte, so a failed,
// cancelled or too large upload leaves nothing behind. r is read in the
// caller's goroutine: a Read that blocks delays the return even after ctx
// is done.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, opts WriteOptions) (FileInfo, error) {
	k, err := c.open(ctx, &Request{
		Op: OpWriteFile, Path: path, Mode: opts.Mode, Recursive: opts.Parents,
		MaxBytes: opts.MaxBytes, User: opts.User,
	})
	if err != nil {
		return FileInfo{}, err
	}
	defer k.finish()

	// The agent may answer before the end (an error, too large): read the
	// response concurrently and stop sending when it comes.
	type result struct {
		resp *Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := k.readResponse(nil, nil)
		done <- result{resp, err}
		k.st.SetWriteDeadline(time.Now())
	}()

	sendErr := sendData(k.st, r)
	if errors.As(sendErr, new(errSource)) {
		// Do not wait for the agent to acknowledge the abort.
		k.st.SetReadDeadline(time.Now())
		return FileInfo{}, fmt.Errorf("agentproto %s: %w", OpWriteFile, sendErr)
	}
	res := <-done
	if res.err != nil {
		return FileInfo{}, res.err
	}
	if sendErr != nil {
		// The agent answered although the data did not all arrive.
		return FileInfo{}, k.err(sendErr)
	}
	if res.resp.File == nil {
		return FileInfo{}, k.err(errors.New("response without file"))
	}
	return *res.resp.File, nil
}

// errSource marks an error of the caller's reader (as opposed to the
// stream).
type errSource struct{ err error }

func (e errSource) Error() string { return "read source: " + e.err.Error() }
func (e errSource) Unwrap() error { return e.err }

// sendData sends r as KindData frames then KindEnd. If r fails, the stream
// is closed without KindEnd (the agent discards the upload).
func sendData(st *yamux.Stream, r io.Reader) error {
	buf := make([]byte, HeaderSize+ChunkSize)
	for {
		n, err := r.Read(buf[HeaderSize:])
		if n > 0 {
			PutHeader(buf, KindData, n)
			if _, werr := st.Write(buf[:HeaderSize+n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return WriteFrame(st, KindEnd, nil)
		}
		if err != nil {
			st.Close()
			return errSource{err}
		}
	}
}

// OpenFile opens the file at path (absolute) for reading. It returns its
// metadata before any data, so that a caller can answer "not found" or set
// a Content-Length first. For a regular file the reader yields exactly
// FileInfo.Size bytes (the size when it was opened); for files whose size
// the kernel does not know (procfs, devices) it reads until their end. The
// reader must be closed; ctx governs it until then.
func (c *Client) OpenFile(ctx context.Context, path string) (FileInfo, io.ReadCloser, error) {
	k, err := c.open(ctx, &Request{Op: OpReadFile, Path: path})
	if err != nil {
		return FileInfo{}, nil, err
	}
	resp, err := k.readResponse(nil, nil)
	if err != nil {
		k.finish()
		return FileInfo{}, nil, err
	}
	if resp.File == nil {
		k.finish()
		return FileInfo{}, nil, k.err(errors.New("response without file"))
	}
	return *resp.File, &fileReader{k: k}, nil
}

// fileReader reads the KindData frames of OpReadFile, copying payloads
// straight from the stream into the caller's buffer.
type fileReader struct {
	k      *call
	remain int // payload bytes left in the current data frame
	err    error
	once   sync.Once
}

func (f *fileReader) Read(p []byte) (int, error) {
	for f.err == nil && f.remain == 0 {
		kind, n, err := ReadHeader(f.k.st)
		if err != nil {
			f.err = f.k.err(err)
			break
		}
		switch kind {
		case KindData:
			f.remain = n
		case KindEnd:
			f.err = io.EOF
		case KindResponse:
			// The agent failed while reading the file.
			payload := make([]byte, n)
			if _, err := io.ReadFull(f.k.st, payload); err != nil {
				f.err = f.k.err(err)
				break
			}
			if _, err := decodeResponse(payload); err != nil {
				f.err = err
			} else {
				f.err = f.k.err(errors.New("response before end of data"))
			}
		default:
			f.err = f.k.err(fmt.Errorf("unexpected frame kind %q", kind))
		}
	}
	if f.remain == 0 {
		return 0, f.err
	}
	if len(p) > f.remain {
		p = p[:f.remain]
	}
	n, err := f.k.st.Read(p)
	f.remain -= n
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		f.err = f.k.err(err)
		if n > 0 {
			return n, nil
		}
		return 0, f.err
	}
	return n, nil
}

// Close ends the read; before the end, the agent stops sending.
func (f *fileReader) Close() error {
	f.once.Do(f.k.finish)
	return nil
}

// Stat describes path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	resp, err := c.roundTrip(ctx, &Request{Op: OpStat, Path: path})
	if err != nil {
		return FileInfo{}, err
	}
	if resp.File == nil {
		return FileInfo{}, c.wrap(ctx, OpStat, errors.New("response without file"))
	}
	return *resp.File, nil
}

// ListDir lists the directory at path, sorted by name.
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	resp, err := c.roundTrip(ctx, &Request{Op: OpListDir, Path: path})
	if err != nil {
		return nil, err
	}
	return resp.Files, nil
}

// Mkdir creates the directory path with mode (0 = 0755), and its missing
// parents if parents is set (then an existing directory is not an error).
// user owns what is created ("" = the sandbox default user).
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32, parents bool, user string) (FileInfo, error) {
	resp, err := c.roundTrip(ctx, &Request{Op: OpMkdir, Path: path, Mode: mode, Recursive: parents, User: user})
	if err != nil {
		return FileInfo{}, err
	}
	if resp.File == nil {
		return FileInfo{}, c.wrap(ctx, OpMkdir, errors.New("response without file"))
	}
	return *resp.File, nil
}

// Rename moves path to target (both absolute; within the sandbox's
// filesystem) and describes it there.
func (c *Client) Rename(ctx context.Context, path, target string) (FileInfo, error) {
	resp, err := c.roundTrip(ctx, &Request{Op: OpRename, Path: path, Target: target})
	if err != nil {
		return FileInfo{}, err
	}
	if resp.File == nil {
		return FileInfo{}, c.wrap(ctx, OpRename, errors.New("response without file"))
	}
	return *resp.File, nil
}

// Remove removes a file or an empty directory, or with recursive a whole
// tree. Removing "/" is refused.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := c.roundTrip(ctx, &Request{Op: OpRemove, Path: path, Recursive: recursive})
	return err
}

// Watch watches the directory path (with recursive, its subdirectories
// too) and returns once the agent watches it. The Watcher's Next returns
// the changes; Close ends the watch. ctx governs it until then.
func (c *Client) Watch(ctx context.Context, path string, recursive bool) (*Watcher, error) {
	k, err := c.open(ctx, &Request{Op: OpWatch, Path: path, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	if _, err := k.readResponse(nil, nil); err != nil {
		k.finish()
		return nil, err
	}
	return &Watcher{k: k}, nil
}

// Watcher is an OpWatch in progress.
type Watcher struct {
	k    *call
	buf  []byte
	once sync.Once
}

// Next returns the next change; io.EOF once the watched directory is gone,
// the agent's *Error if the watch failed.
func (w *Watcher) Next() (WatchEvent, error) {
	kind, payload, err := ReadFrame(w.k.st, w.buf)
	if err != nil {
		return WatchEvent{}, w.k.err(err)
	}
	if cap(payload) > cap(w.buf) {
		w.buf = payload
	}
	switch kind {
	case KindData:
		var ev WatchEvent
		if err := json.Unmarshal(payload, &ev); err != nil {
			return WatchEvent{}, w.k.err(fmt.Errorf("decode event: %w", err))
		}
		return ev, nil
	case KindEnd:
		return WatchEvent{}, io.EOF
	case KindResponse:
		if _, err := decodeResponse(payload); err != nil {
			return WatchEvent{}, err
		}
		return WatchEvent{}, w.k.err(errors.New("response during a watch"))
	default:
		return WatchEvent{}, w.k.err(fmt.Errorf("unexpected frame kind %q", kind))
	}
}

// Close ends the watch.
func (w *Watcher) Close() error {
	w.once.Do(w.k.finish)
	return nil
}
