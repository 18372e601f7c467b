// Package grpcnode is the node contract (internal/nodeapi) over gRPC
// (proto/evalbox/node/v1/node.proto): NewServer serves any nodeapi.Node,
// and Client is a nodeapi.Node that calls one. Errors cross as statuses
// with a typed detail and come back as the same Go errors (errors.go);
// streams keep gRPC's flow control end to end, so that neither side holds
// more than a chunk and the HTTP/2 windows of a transfer or of a command's
// output. Every call carries a shared bearer token, over TLS (optionally
// mutual) unless both ends are on loopback or plaintext is allowed
// explicitly (auth.go).
package grpcnode

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/evalbox/evalbox/internal/nodeapi"
	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
)

// ChunkSize is the most data one message of a file transfer carries.
const ChunkSize = 1 << 20

// readChunk is the buffer a download is read into: the agent's own frames
// are smaller, so a message carries what one read returned.
const readChunk = 256 << 10

// maxServerRecv bounds a message the server accepts: a data chunk, or a
// request whose env may hold 256 variables of 32 KiB.
const maxServerRecv = 16 << 20

// The HTTP/2 flow-control windows of both ends: a stream may have 4 MiB in
// flight (as the agent protocol's yamux streams), a connection 16 MiB. They
// bound what a slow reader makes the other side hold, and set the
// throughput of a transfer (gRPC's default windows start at 64 KiB).
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// ServerConfig configures NewServer.
type ServerConfig struct {
	// Token is the shared secret every call must carry as "authorization:
	// Bearer <token>" (required; 32 random bytes, say). Never logged.
	Token string
	// TLS, when set, is the listener's TLS configuration (ServerTLS; with
	// ClientAuth RequireAndVerifyClientCert for mutual TLS).
	TLS *tls.Config
	// AllowInsecure serves calls without TLS from peers not on loopback
	// (a network the operator trusts). Without it a plaintext server
	// answers loopback peers only.
	AllowInsecure bool
	Logger        *slog.Logger
}

// NewServer returns a gRPC server that serves n: register nothing else on
// it, and Serve it on a listener.
func NewServer(n nodeapi.Node, cfg ServerConfig) (*grpc.Server, error) {
	if cfg.Token == "" {
		return nil, errors.New("grpcnode: a node server needs a token")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &authorizer{token: []byte("Bearer " + cfg.Token), allowInsecure: cfg.AllowInsecure, log: cfg.Logger}
	opts := []grpc.ServerOption{
		grpc.UnaryInterceptor(a.unary), grpc.StreamInterceptor(a.stream),
		grpc.MaxRecvMsgSize(maxServerRecv),
		grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(connWindow),
		// A control plane keeps long calls open (Wait, attached
		// output): pings find a dead peer, a client may ping every 10 s.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	srv := grpc.NewServer(opts...)
	pb.RegisterNodeServer(srv, &server{n: n, log: cfg.Logger})
	return srv, nil
}

// server serves a nodeapi.Node. It embeds UnsafeNodeServer, not
// UnimplementedNodeServer: an rpc without its method does not compile.
type server struct {
	pb.UnsafeNodeServer
	n   nodeapi.Node
	log *slog.Logger
}

func (s *server) Runtimes(ctx context.Context, _ *pb.RuntimesRequest) (*pb.RuntimesResponse, error) {
	rts, err := s.n.Runtimes(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.RuntimesResponse{Runtimes: rts}, nil
}

func (s *server) Capacity(ctx context.Context, _ *pb.CapacityRequest) (*pb.CapacityStatus, error) {
	c, err := s.n.Capacity(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return pbCapacity(c), nil
}

func (s *server) TemplatesPresent(ctx context.Context, req *pb.TemplatesPresentRequest) (*pb.TemplatesPresentResponse, error) {
	ds, err := s.n.TemplatesPresent(ctx, req.GetDigests())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.TemplatesPresentResponse{Digests: ds}, nil
}

func (s *server) SetPool(ctx context.Context, req *pb.SetPoolRequest) (*pb.SetPoolResponse, error) {
	err := s.n.SetPool(ctx, nodeapi.PoolSpec{Spec: spec(req.GetSpec()), TemplateName: req.GetTemplateName(), Target: int(req.GetTarget())})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.SetPoolResponse{}, nil
}

func (s *server) Pools(ctx context.Context, _ *pb.PoolsRequest) (*pb.PoolsResponse, error) {
	ps, err := s.n.Pools(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.PoolsResponse{Pools: make([]*pb.PoolStatus, len(ps))}
	for i, p := range ps {
		out.Pools[i] = pbPoolStatus(p)
	}
	return out, nil
}

func (s *server) Create(ctx context.Context, req *pb.CreateRequest) (*pb.SandboxInfo, error) {
	info, err := s.n.Create(ctx, nodeapi.CreateRequest{Spec: spec(req.GetSpec()), Wait: time.Duration(req.GetWaitNanos()),
		ContentDigest: req.GetContentDigest(), Env: req.GetEnv(), Secrets: req.GetSecrets(), Egress: egress(req.GetEgress()), Snapshot: req.GetSnapshot()})
	if err != nil {
		return nil, toStatus(err)
	}
	return pbSandboxInfo(info), nil
}

func (s *server) SetEgress(ctx context.Context, req *pb.SetEgressRequest) (*pb.SetEgressResponse, error) {
	if err := s.n.SetEgress(ctx, req.GetSandboxId(), egress(req.GetEgress())); err != nil {
		return nil, toStatus(err)
	}
	return &pb.SetEgressResponse{}, nil
}

func (s *server) Snapshot(ctx context.Context, req *pb.SnapshotRequest) (*pb.SnapshotInfo, error) {
	info, err := s.n.Snapshot(ctx, req.GetSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	return pbSnapshotInfo(info), nil
}

func (s *server) DeleteSnapshot(ctx context.Context, req *pb.DeleteSnapshotRequest) (*pb.DeleteSnapshotResponse, error) {
	if err := s.n.DeleteSnapshot(ctx, req.GetSnapshotId()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.DeleteSnapshotResponse{}, nil
}

func (s *server) Pause(ctx context.Context, req *pb.PauseRequest) (*pb.PauseResponse, error) {
	if err := s.n.Pause(ctx, req.GetSandboxId()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.PauseResponse{}, nil
}

func (s *server) Resume(ctx context.Context, req *pb.ResumeRequest) (*pb.ResumeResponse, error) {
	if err := s.n.Resume(ctx, req.GetSandboxId(), time.Duration(req.GetWaitNanos())); err != nil {
		return nil, toStatus(err)
	}
	return &pb.ResumeResponse{}, nil
}

func (s *server) Destroy(ctx context.Context, req *pb.DestroyRequest) (*pb.DestroyResponse, error) {
	if err := s.n.Destroy(ctx, req.GetSandboxId()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.DestroyResponse{}, nil
}

func (s *server) Wait(req *pb.WaitRequest, st pb.Node_WaitServer) error {
	end, err := s.n.Wait(st.Context(), req.GetSandboxId())
	if err != nil {
		return toStatus(err)
	}
	return st.Send(&pb.SandboxEnd{Reason: end.Reason, OomKills: end.OOMKills})
}

// outputSender sends a command's output and its exit on one stream. The
// contract does not promise that stdout and stderr are written from one
// goroutine, and a gRPC stream takes one sender at a time.
type outputSender struct {
	mu   sync.Mutex
	send func(*pb.OutputMessage) error
}

func (o *outputSender) emit(m *pb.OutputMessage) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.send(m)
}

// streamWriter is stdout or stderr of an outputSender. Send marshals the
// message before it returns, so p is not kept; it blocks while the
// client's window is full, which stops the agent's output pump.
type streamWriter struct {
	o      *outputSender
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	m := &pb.OutputMessage{Message: &pb.OutputMessage_Stdout{Stdout: p}}
	if w.stderr {
		m.Message = &pb.OutputMessage_Stderr{Stderr: p}
	}
	if err := w.o.emit(m); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *server) Exec(st pb.Node_ExecServer) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	start := m.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "grpcnode: the first message of exec must be start")
	}
	// A client that breaks the protocol midway ends the call: the process
	// tree is killed as when it cancels.
	ctx, cancel := context.WithCancelCause(st.Context())
	defer cancel(nil)
	req := execRequest(start.GetRequest())
	var stdin io.Reader
	if req.Stdin {
		stdin = &chunkReader{recv: func() ([]byte, error) {
			m, err := st.Recv()
			if err != nil {
				return nil, err
			}
			if m.GetStart() != nil {
				err := status.Error(codes.InvalidArgument, "grpcnode: a second exec start")
				cancel(err)
				return nil, err
			}
			return m.GetStdin(), nil
		}}
	}
	o := &outputSender{send: st.Send}
	x, err := s.n.Exec(ctx, start.GetSandboxId(), req, stdin, streamWriter{o, false}, streamWriter{o, true})
	if cause := context.Cause(ctx); cause != nil && st.Context().Err() == nil {
		return cause
	}
	if err != nil {
		return toStatus(err)
	}
	return o.emit(&pb.OutputMessage{Message: &pb.OutputMessage_Exit{Exit: pbExit(x)}})
}

// chunkReader reads the data of a client stream, one message at a time:
// it holds at most the message it is reading from. The end of the client's
// sending is io.EOF; a cancelled call is an error.
type chunkReader struct {
	recv func() ([]byte, error)
	buf  []byte
	err  error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.buf, r.err = r.recv()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (s *server) StartProcess(ctx context.Context, req *pb.StartProcessRequest) (*pb.ProcInfo, error) {
	p, err := s.n.StartProcess(ctx, req.GetSandboxId(), execRequest(req.GetRequest()))
	if err != nil {
		return nil, toStatus(err)
	}
	return pbProc(p), nil
}

func (s *server) ListProcesses(ctx context.Context, req *pb.ListProcessesRequest) (*pb.ListProcessesResponse, error) {
	ps, err := s.n.ListProcesses(ctx, req.GetSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.ListProcessesResponse{Processes: make([]*pb.ProcInfo, len(ps))}
	for i, p := range ps {
		out.Processes[i] = pbProc(p)
	}
	return out, nil
}

func (s *server) AttachProcess(req *pb.AttachProcessRequest, st pb.Node_AttachProcessServer) error {
	o := &outputSender{send: st.Send}
	x, err := s.n.AttachProcess(st.Context(), req.GetSandboxId(), req.GetProcessId(), streamWriter{o, false}, streamWriter{o, true})
	if err != nil {
		return toStatus(err)
	}
	return o.emit(&pb.OutputMessage{Message: &pb.OutputMessage_Exit{Exit: pbExit(x)}})
}

func (s *server) WaitProcess(ctx context.Context, req *pb.WaitProcessRequest) (*pb.ExitInfo, error) {
	x, err := s.n.WaitProcess(ctx, req.GetSandboxId(), req.GetProcessId())
	if err != nil {
		return nil, toStatus(err)
	}
	return pbExit(x), nil
}

func (s *server) SignalProcess(ctx context.Context, req *pb.SignalProcessRequest) (*pb.SignalProcessResponse, error) {
	if err := s.n.SignalProcess(ctx, req.GetSandboxId(), req.GetProcessId(), int(req.GetSignal())); err != nil {
		return nil, toStatus(err)
	}
	return &pb.SignalProcessResponse{}, nil
}

func (s *server) WriteStdin(ctx context.Context, req *pb.WriteStdinRequest) (*pb.WriteStdinResponse, error) {
	if err := s.n.WriteStdin(ctx, req.GetSandboxId(), req.GetProcessId(), req.GetData(), req.GetClose()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.WriteStdinResponse{}, nil
}

func (s *server) WriteFile(st pb.Node_WriteFileServer) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	start := m.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "grpcnode: the first message of write_file must be start")
	}
	// The upload is aborted (nothing is left) when the reader fails: the
	// client cancelled, or broke the protocol.
	ctx, cancel := context.WithCancelCause(st.Context())
	defer cancel(nil)
	r := &chunkReader{recv: func() ([]byte, error) {
		m, err := st.Recv()
		if err != nil {
			return nil, err
		}
		if m.GetStart() != nil {
			err := status.Error(codes.InvalidArgument, "grpcnode: a second write_file start")
			cancel(err)
			return nil, err
		}
		return m.GetData(), nil
	}}
	opts := nodeapi.WriteOptions{Mode: start.GetMode(), Parents: start.GetParents(), MaxBytes: start.GetMaxBytes(), User: start.GetUser()}
	fi, err := s.n.WriteFile(ctx, start.GetSandboxId(), start.GetPath(), r, opts)
	if cause := context.Cause(ctx); cause != nil && st.Context().Err() == nil {
		return cause
	}
	if err != nil {
		return toStatus(err)
	}
	return st.SendAndClose(pbFile(fi))
}

func (s *server) OpenFile(req *pb.OpenFileRequest, st pb.Node_OpenFileServer) error {
	fi, rc, err := s.n.OpenFile(st.Context(), req.GetSandboxId(), req.GetPath())
	if err != nil {
		return toStatus(err)
	}
	defer rc.Close()
	if err := st.Send(&pb.OpenFileMessage{Message: &pb.OpenFileMessage_Info{Info: pbFile(fi)}}); err != nil {
		return err
	}
	buf := make([]byte, readChunk)
	for {
		n, err := rc.Read(buf)
		if n > 0 {
			// Blocks while the client's window is full: the agent's
			// stream then stops too.
			if serr := st.Send(&pb.OpenFileMessage{Message: &pb.OpenFileMessage_Data{Data: buf[:n]}}); serr != nil {
				return serr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return toStatus(err)
		}
	}
}

func (s *server) WatchDir(req *pb.WatchDirRequest, st pb.Node_WatchDirServer) error {
	w, err := s.n.WatchDir(st.Context(), req.GetSandboxId(), req.GetPath(), req.GetRecursive())
	if err != nil {
		return toStatus(err)
	}
	defer w.Close()
	if err := st.Send(&pb.WatchDirMessage{Message: &pb.WatchDirMessage_Started{Started: &pb.WatchDirStarted{}}}); err != nil {
		return err
	}
	for {
		ev, err := w.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return toStatus(err)
		}
		if err := st.Send(&pb.WatchDirMessage{Message: &pb.WatchDirMessage_Event{Event: &pb.WatchEvent{Type: ev.Type, Name: ev.Name}}}); err != nil {
			return err
		}
	}
}

func (s *server) Stat(ctx context.Context, req *pb.StatRequest) (*pb.FileInfo, error) {
	fi, err := s.n.Stat(ctx, req.GetSandboxId(), req.GetPath())
	if err != nil {
		return nil, toStatus(err)
	}
	return pbFile(fi), nil
}

func (s *server) ListDir(ctx context.Context, req *pb.ListDirRequest) (*pb.ListDirResponse, error) {
	fs, err := s.n.ListDir(ctx, req.GetSandboxId(), req.GetPath())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.ListDirResponse{Files: make([]*pb.FileInfo, len(fs))}
	for i, f := range fs {
		out.Files[i] = pbFile(f)
	}
	return out, nil
}

func (s *server) Mkdir(ctx context.Context, req *pb.MkdirRequest) (*pb.FileInfo, error) {
	fi, err := s.n.Mkdir(ctx, req.GetSandboxId(), req.GetPath(), nodeapi.MkdirOptions{Mode: req.GetMode(), Parents: req.GetParents(), User: req.GetUser()})
	if err != nil {
		return nil, toStatus(err)
	}
	return pbFile(fi), nil
}

func (s *server) Rename(ctx context.Context, req *pb.RenameRequest) (*pb.FileInfo, error) {
	fi, err := s.n.Rename(ctx, req.GetSandboxId(), req.GetPath(), req.GetTarget())
	if err != nil {
		return nil, toStatus(err)
	}
	return pbFile(fi), nil
}

func (s *server) Remove(ctx context.Context, req *pb.RemoveRequest) (*pb.RemoveResponse, error) {
	if err := s.n.Remove(ctx, req.GetSandboxId(), req.GetPath(), req.GetRecursive()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.RemoveResponse{}, nil
}
