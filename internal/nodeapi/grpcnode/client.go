package grpcnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/evalbox/evalbox/internal/nodeapi"
	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
)

// maxClientRecv bounds a message the client accepts: a listing of a large
// directory, or a data chunk.
const maxClientRecv = 64 << 20

// stdinChunk is the most stdin one exec message carries.
const stdinChunk = 64 << 10

// ClientConfig configures Dial.
type ClientConfig struct {
	// Token is the node's shared secret (required).
	Token string
	// TLS, when set, is used to connect (ClientTLS).
	TLS *tls.Config
	// AllowInsecure dials a node not on loopback without TLS, sending the
	// token in plaintext (a network the operator trusts). Without it Dial
	// refuses to.
	AllowInsecure bool
}

// Dial returns a connection to the node at target ("host:port"). It does
// not wait for the node: calls fail with nodeapi.ErrNodeUnreachable while
// it cannot be reached.
func Dial(target string, cfg ClientConfig) (*grpc.ClientConn, error) {
	if cfg.Token == "" {
		return nil, errors.New("grpcnode: dialing a node needs its token")
	}
	creds := credentials.NewTLS(cfg.TLS)
	if cfg.TLS == nil {
		if !cfg.AllowInsecure && !isLoopbackTarget(target) {
			return nil, fmt.Errorf("grpcnode: refusing to send the node token in plaintext to %s: give the node's TLS settings (or allow insecure)", target)
		}
		creds = insecure.NewCredentials()
	}
	return grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(tokenCredentials{header: "Bearer " + cfg.Token, secure: cfg.TLS != nil}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxClientRecv)),
		grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
	)
}

// Client is a nodeapi.Node served by a remote node (NewServer).
type Client struct {
	c        pb.NodeClient
	runtimes atomic.Pointer[[]string]
}

var _ nodeapi.Node = (*Client)(nil)

// NewClient returns the node behind cc (Dial).
func NewClient(cc grpc.ClientConnInterface) *Client { return &Client{c: pb.NewNodeClient(cc)} }

// Runtimes lists the node's runtimes; they do not change while a node
// runs, so the first answer is kept.
func (c *Client) Runtimes(ctx context.Context) ([]string, error) {
	if rts := c.runtimes.Load(); rts != nil {
		return *rts, nil
	}
	resp, err := c.c.Runtimes(ctx, &pb.RuntimesRequest{})
	if err != nil {
		return nil, fromStatus(ctx, "runtimes", err)
	}
	rts := resp.GetRuntimes()
	c.runtimes.Store(&rts)
	return rts, nil
}

func (c *Client) Capacity(ctx context.Context) (nodeapi.CapacityStatus, error) {
	resp, err := c.c.Capacity(ctx, &pb.CapacityRequest{})
	if err != nil {
		return nodeapi.CapacityStatus{}, fromStatus(ctx, "capacity", err)
	}
	return capacity(resp), nil
}

func (c *Client) TemplatesPresent(ctx context.Context, digests []string) ([]string, error) {
	resp, err := c.c.TemplatesPresent(ctx, &pb.TemplatesPresentRequest{Digests: digests})
	if err != nil {
		return nil, fromStatus(ctx, "templates_present", err)
	}
	return resp.GetDigests(), nil
}

func (c *Client) SetPool(ctx context.Context, p nodeapi.PoolSpec) error {
	_, err := c.c.SetPool(ctx, &pb.SetPoolRequest{Spec: pbSpec(p.Spec), TemplateName: p.TemplateName, Target: int64(p.Target)})
	return fromStatus(ctx, "set_pool", err)
}

func (c *Client) Pools(ctx context.Context) ([]nodeapi.PoolStatus, error) {
	resp, err := c.c.Pools(ctx, &pb.PoolsRequest{})
	if err != nil {
		return nil, fromStatus(ctx, "pools", err)
	}
	out := make([]nodeapi.PoolStatus, len(resp.GetPools()))
	for i, p := range resp.GetPools() {
		out[i] = poolStatus(p)
	}
	return out, nil
}

func (c *Client) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	resp, err := c.c.Create(ctx, &pb.CreateRequest{Spec: pbSpec(req.Spec), WaitNanos: int64(req.Wait), ContentDigest: req.ContentDigest, Env: req.Env, Secrets: req.Secrets,
		Egress: pbEgress(req.Egress), Snapshot: req.Snapshot})
	if err != nil {
		return nodeapi.SandboxInfo{}, fromStatus(ctx, "create", err)
	}
	return sandboxInfo(resp), nil
}

func (c *Client) SetEgress(ctx context.Context, id string, e *nodeapi.Egress) error {
	_, err := c.c.SetEgress(ctx, &pb.SetEgressRequest{SandboxId: id, Egress: pbEgress(e)})
	return fromStatus(ctx, "set egress", err)
}

func (c *Client) Snapshot(ctx context.Context, id string) (nodeapi.SnapshotInfo, error) {
	resp, err := c.c.Snapshot(ctx, &pb.SnapshotRequest{SandboxId: id})
	if err != nil {
		return nodeapi.SnapshotInfo{}, fromStatus(ctx, "snapshot", err)
	}
	return snapshotInfo(resp), nil
}

func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	_, err := c.c.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{SnapshotId: snapshotID})
	return fromStatus(ctx, "delete snapshot", err)
}

func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := c.c.Pause(ctx, &pb.PauseRequest{SandboxId: id})
	return fromStatus(ctx, "pause", err)
}

func (c *Client) Resume(ctx context.Context, id string, wait time.Duration) error {
	_, err := c.c.Resume(ctx, &pb.ResumeRequest{SandboxId: id, WaitNanos: int64(wait)})
	return fromStatus(ctx, "resume", err)
}

func (c *Client) Destroy(ctx context.Context, id string) error {
	_, err := c.c.Destroy(ctx, &pb.DestroyRequest{SandboxId: id})
	return fromStatus(ctx, "destroy", err)
}

func (c *Client) Wait(ctx context.Context, id string) (nodeapi.End, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.c.Wait(ctx, &pb.WaitRequest{SandboxId: id})
	if err != nil {
		return nodeapi.End{}, fromStatus(ctx, "wait", err)
	}
	m, err := st.Recv()
	if err == io.EOF {
		return nodeapi.End{}, fmt.Errorf("grpcnode wait: %w: the node closed the stream without an end", nodeapi.ErrNodeUnreachable)
	}
	if err != nil {
		return nodeapi.End{}, fromStatus(ctx, "wait", err)
	}
	return nodeapi.End{Reason: m.GetReason(), OOMKills: m.GetOomKills()}, nil
}

// readOutput reads output messages until the exit, writing the output to
// stdout and stderr (nil discards). A writer's error ends the call (the
// caller cancels it: the node kills an exec, detaches an attach).
func readOutput(ctx context.Context, op string, recv func() (*pb.OutputMessage, error), stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	for {
		m, err := recv()
		if err == io.EOF {
			return nodeapi.ExitInfo{}, fmt.Errorf("grpcnode %s: the node ended the stream without an exit", op)
		}
		if err != nil {
			return nodeapi.ExitInfo{}, fromStatus(ctx, op, err)
		}
		var w io.Writer
		var p []byte
		switch m := m.GetMessage().(type) {
		case *pb.OutputMessage_Stdout:
			w, p = stdout, m.Stdout
		case *pb.OutputMessage_Stderr:
			w, p = stderr, m.Stderr
		case *pb.OutputMessage_Exit:
			return exit(m.Exit), nil
		default:
			return nodeapi.ExitInfo{}, fmt.Errorf("grpcnode %s: an output message of no known kind", op)
		}
		if w != nil && len(p) > 0 {
			if _, err := w.Write(p); err != nil {
				return nodeapi.ExitInfo{}, fmt.Errorf("grpcnode %s: write output: %w", op, err)
			}
		}
	}
}

func (c *Client) Exec(ctx context.Context, id string, req nodeapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	// Cancelling the call (ctx, or returning early) kills the process tree.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.c.Exec(ctx)
	if err != nil {
		return nodeapi.ExitInfo{}, fromStatus(ctx, "exec", err)
	}
	req.Stdin = stdin != nil
	if err := st.Send(&pb.ExecClientMessage{Message: &pb.ExecClientMessage_Start{Start: &pb.ExecStart{SandboxId: id, Request: pbExecRequest(req)}}}); err != nil && err != io.EOF {
		return nodeapi.ExitInfo{}, fromStatus(ctx, "exec", err)
	}
	done := make(chan struct{})
	defer close(done)
	if stdin != nil {
		go copyStdin(st, stdin, done)
	} else {
		_ = st.CloseSend()
	}
	return readOutput(ctx, "exec", st.Recv, stdout, stderr)
}

// copyStdin sends stdin, then ends the call's sending (the process's stdin
// closes: at its end, or when it fails). It stops when the exec is done; a
// Read that blocks keeps it until the Read returns.
func copyStdin(st pb.Node_ExecClient, r io.Reader, done <-chan struct{}) {
	defer st.CloseSend()
	buf := make([]byte, stdinChunk)
	for {
		n, err := r.Read(buf)
		select {
		case <-done:
			return
		default:
		}
		if n > 0 {
			if st.Send(&pb.ExecClientMessage{Message: &pb.ExecClientMessage_Stdin{Stdin: buf[:n]}}) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (c *Client) StartProcess(ctx context.Context, id string, req nodeapi.ExecRequest) (nodeapi.ProcInfo, error) {
	resp, err := c.c.StartProcess(ctx, &pb.StartProcessRequest{SandboxId: id, Request: pbExecRequest(req)})
	if err != nil {
		return nodeapi.ProcInfo{}, fromStatus(ctx, "start_process", err)
	}
	return proc(resp), nil
}

func (c *Client) ListProcesses(ctx context.Context, id string) ([]nodeapi.ProcInfo, error) {
	resp, err := c.c.ListProcesses(ctx, &pb.ListProcessesRequest{SandboxId: id})
	if err != nil {
		return nil, fromStatus(ctx, "list_processes", err)
	}
	out := make([]nodeapi.ProcInfo, len(resp.GetProcesses()))
	for i, p := range resp.GetProcesses() {
		out[i] = proc(p)
	}
	return out, nil
}

func (c *Client) AttachProcess(ctx context.Context, id, procID string, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.c.AttachProcess(ctx, &pb.AttachProcessRequest{SandboxId: id, ProcessId: procID})
	if err != nil {
		return nodeapi.ExitInfo{}, fromStatus(ctx, "attach_process", err)
	}
	return readOutput(ctx, "attach_process", st.Recv, stdout, stderr)
}

func (c *Client) WaitProcess(ctx context.Context, id, procID string) (nodeapi.ExitInfo, error) {
	resp, err := c.c.WaitProcess(ctx, &pb.WaitProcessRequest{SandboxId: id, ProcessId: procID})
	if err != nil {
		return nodeapi.ExitInfo{}, fromStatus(ctx, "wait_process", err)
	}
	return exit(resp), nil
}

func (c *Client) SignalProcess(ctx context.Context, id, procID string, sig int) error {
	_, err := c.c.SignalProcess(ctx, &pb.SignalProcessRequest{SandboxId: id, ProcessId: procID, Signal: int64(sig)})
	return fromStatus(ctx, "signal_process", err)
}

func (c *Client) WriteStdin(ctx context.Context, id, procID string, data []byte, closeAfter bool) error {
	_, err := c.c.WriteStdin(ctx, &pb.WriteStdinRequest{SandboxId: id, ProcessId: procID, Data: data, Close: closeAfter})
	return fromStatus(ctx, "write_stdin", err)
}

// WriteFile sends r in chunks of at most ChunkSize, each Send waiting for
// the call's flow-control window: a slow node slows the reading of r. A
// failing r cancels the call (the node discards the upload) rather than
// ending it, which would be taken for the end of the file.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, opts nodeapi.WriteOptions) (nodeapi.FileInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.c.WriteFile(ctx)
	if err != nil {
		return nodeapi.FileInfo{}, fromStatus(ctx, "write_file", err)
	}
	start := &pb.WriteFileStart{SandboxId: id, Path: path, Mode: opts.Mode, Parents: opts.Parents, MaxBytes: opts.MaxBytes, User: opts.User}
	sendErr := st.Send(&pb.WriteFileMessage{Message: &pb.WriteFileMessage_Start{Start: start}})
	buf := make([]byte, ChunkSize)
	for sendErr == nil {
		n, rerr := r.Read(buf)
		if n > 0 {
			sendErr = st.Send(&pb.WriteFileMessage{Message: &pb.WriteFileMessage_Data{Data: buf[:n]}})
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			cancel()
			return nodeapi.FileInfo{}, fmt.Errorf("grpcnode write_file: read source: %w", rerr)
		}
	}
	// io.EOF from Send: the node answered early (too large, an error);
	// CloseAndRecv has its answer.
	if sendErr != nil && sendErr != io.EOF {
		return nodeapi.FileInfo{}, fromStatus(ctx, "write_file", sendErr)
	}
	fi, err := st.CloseAndRecv()
	if err != nil {
		return nodeapi.FileInfo{}, fromStatus(ctx, "write_file", err)
	}
	return file(fi), nil
}

// OpenFile returns the file's info (the node's first message) and a
// reader of the rest; closing the reader cancels the call.
func (c *Client) OpenFile(ctx context.Context, id, path string) (nodeapi.FileInfo, io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := c.c.OpenFile(ctx, &pb.OpenFileRequest{SandboxId: id, Path: path})
	if err != nil {
		err = fromStatus(ctx, "open_file", err)
		cancel()
		return nodeapi.FileInfo{}, nil, err
	}
	m, err := st.Recv()
	if err == io.EOF {
		cancel()
		return nodeapi.FileInfo{}, nil, errors.New("grpcnode open_file: the node ended the stream without the file's info")
	}
	if err != nil {
		err = fromStatus(ctx, "open_file", err)
		cancel()
		return nodeapi.FileInfo{}, nil, err
	}
	info := m.GetInfo()
	if info == nil {
		cancel()
		return nodeapi.FileInfo{}, nil, errors.New("grpcnode open_file: the node sent data before the file's info")
	}
	r := &downloadReader{cancel: cancel}
	r.chunks = chunkReader{recv: func() ([]byte, error) {
		m, err := st.Recv()
		if err == io.EOF {
			return nil, io.EOF
		}
		if err != nil {
			return nil, fromStatus(ctx, "open_file", err)
		}
		if m.GetInfo() != nil {
			return nil, errors.New("grpcnode open_file: a second info message")
		}
		return m.GetData(), nil
	}}
	return file(info), r, nil
}

// WatchDir watches a directory of a sandbox on the node.
func (c *Client) WatchDir(ctx context.Context, id, path string, recursive bool) (nodeapi.DirWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := c.c.WatchDir(ctx, &pb.WatchDirRequest{SandboxId: id, Path: path, Recursive: recursive})
	if err != nil {
		cancel()
		return nil, fromStatus(ctx, "watch_dir", err)
	}
	m, err := st.Recv()
	switch {
	case err == io.EOF:
		err = errors.New("grpcnode watch_dir: the node ended the stream before the watch started")
	case err != nil:
		err = fromStatus(ctx, "watch_dir", err)
	case m.GetStarted() == nil:
		err = errors.New("grpcnode watch_dir: an event before the watch started")
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &dirWatch{ctx: ctx, st: st, cancel: cancel}, nil
}

type dirWatch struct {
	ctx    context.Context
	st     pb.Node_WatchDirClient
	cancel context.CancelFunc
}

func (w *dirWatch) Next() (nodeapi.WatchEvent, error) {
	m, err := w.st.Recv()
	if err == io.EOF {
		return nodeapi.WatchEvent{}, io.EOF
	}
	if err != nil {
		return nodeapi.WatchEvent{}, fromStatus(w.ctx, "watch_dir", err)
	}
	ev := m.GetEvent()
	if ev == nil {
		return nodeapi.WatchEvent{}, errors.New("grpcnode watch_dir: a second started message")
	}
	return nodeapi.WatchEvent{Type: ev.GetType(), Name: ev.GetName()}, nil
}

func (w *dirWatch) Close() error {
	w.cancel()
	return nil
}

type downloadReader struct {
	chunks chunkReader
	cancel context.CancelFunc
}

func (r *downloadReader) Read(p []byte) (int, error) { return r.chunks.Read(p) }

// Close ends the download (before its end, the node stops sending).
func (r *downloadReader) Close() error {
	r.cancel()
	return nil
}

func (c *Client) Stat(ctx context.Context, id, path string) (nodeapi.FileInfo, error) {
	resp, err := c.c.Stat(ctx, &pb.StatRequest{SandboxId: id, Path: path})
	if err != nil {
		return nodeapi.FileInfo{}, fromStatus(ctx, "stat", err)
	}
	return file(resp), nil
}

func (c *Client) ListDir(ctx context.Context, id, path string) ([]nodeapi.FileInfo, error) {
	resp, err := c.c.ListDir(ctx, &pb.ListDirRequest{SandboxId: id, Path: path})
	if err != nil {
		return nil, fromStatus(ctx, "list_dir", err)
	}
	out := make([]nodeapi.FileInfo, len(resp.GetFiles()))
	for i, f := range resp.GetFiles() {
		out[i] = file(f)
	}
	return out, nil
}

func (c *Client) Mkdir(ctx context.Context, id, path string, opts nodeapi.MkdirOptions) (nodeapi.FileInfo, error) {
	resp, err := c.c.Mkdir(ctx, &pb.MkdirRequest{SandboxId: id, Path: path, Mode: opts.Mode, Parents: opts.Parents, User: opts.User})
	if err != nil {
		return nodeapi.FileInfo{}, fromStatus(ctx, "mkdir", err)
	}
	return file(resp), nil
}

func (c *Client) Rename(ctx context.Context, id, path, target string) (nodeapi.FileInfo, error) {
	resp, err := c.c.Rename(ctx, &pb.RenameRequest{SandboxId: id, Path: path, Target: target})
	if err != nil {
		return nodeapi.FileInfo{}, fromStatus(ctx, "rename", err)
	}
	return file(resp), nil
}

func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	_, err := c.c.Remove(ctx, &pb.RemoveRequest{SandboxId: id, Path: path, Recursive: recursive})
	return fromStatus(ctx, "remove", err)
}
