package grpcnode

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/evalbox/evalbox/internal/nodeapi"
	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
)

// portChunk is the most data one ConnectPort message carries; the node
// reads the port in smaller pieces (portReadChunk), so that an idle
// connection holds little.
const (
	portChunk     = 1 << 20
	portReadChunk = 64 << 10
)

// ConnectPort serves a connection to a sandbox's port: open, then bytes
// both ways (see node.proto).
func (s *server) ConnectPort(st pb.Node_ConnectPortServer) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	open := m.GetOpen()
	if open == nil {
		return status.Error(codes.InvalidArgument, "grpcnode: the first message of connect_port must be open")
	}
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	conn, err := s.n.ConnectPort(ctx, open.GetSandboxId(), int(open.GetPort()))
	if err != nil {
		return toStatus(err)
	}
	defer conn.Close()
	var sendMu sync.Mutex
	send := func(m *pb.PortServerMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(m)
	}
	if err := send(&pb.PortServerMessage{Message: &pb.PortServerMessage_Opened{Opened: true}}); err != nil {
		return err
	}
	// Client → port, until the client's half-close (or the end of its
	// sending); a client that breaks the protocol aborts the connection.
	inErr := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err == io.EOF || (err == nil && m.GetCloseWrite()) {
				inErr <- conn.CloseWrite()
				return
			}
			if err != nil {
				cancel()
				conn.Close()
				inErr <- err
				return
			}
			if m.GetOpen() != nil {
				cancel()
				conn.Close()
				inErr <- status.Error(codes.InvalidArgument, "grpcnode: a second connect_port open")
				return
			}
			if _, err := conn.Write(m.GetData()); err != nil {
				inErr <- nil // the port side failed: its reader says how
				return
			}
		}
	}()
	// Port → client.
	buf := make([]byte, portReadChunk)
	var outErr error
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if serr := send(&pb.PortServerMessage{Message: &pb.PortServerMessage_Data{Data: buf[:n]}}); serr != nil {
				outErr = serr
				break
			}
		}
		if err == io.EOF {
			outErr = send(&pb.PortServerMessage{Message: &pb.PortServerMessage_CloseWrite{CloseWrite: true}})
			break
		}
		if err != nil {
			cancel()
			outErr = toStatus(err)
			break
		}
	}
	if outErr != nil {
		// Not waiting for the client's side: its Recv returns only once
		// this handler has (inErr is buffered).
		cancel()
		conn.Close()
		return outErr
	}
	// The port's side is done: the call ends once the client's is too.
	if err := <-inErr; err != nil && st.Context().Err() == nil {
		return toStatus(err)
	}
	return nil
}

// ConnectPort connects to a port of a sandbox on the node.
func (c *Client) ConnectPort(ctx context.Context, id string, port int) (nodeapi.PortConn, error) {
	cctx, cancel := context.WithCancel(ctx)
	fail := func(err error) (nodeapi.PortConn, error) {
		err = fromStatus(ctx, "connect_port", err) // before cancel: ctx's own end only
		cancel()
		return nil, err
	}
	st, err := c.c.ConnectPort(cctx)
	if err != nil {
		return fail(err)
	}
	if err := st.Send(&pb.PortClientMessage{Message: &pb.PortClientMessage_Open{Open: &pb.PortOpen{SandboxId: id, Port: int32(port)}}}); err != nil && err != io.EOF {
		return fail(err)
	}
	m, err := st.Recv()
	if err != nil {
		return fail(err)
	}
	if !m.GetOpened() {
		return fail(errors.New("no opened message"))
	}
	return &portConn{ctx: ctx, cancel: cancel, st: st}, nil
}

// portConn is the client's end of a ConnectPort call.
type portConn struct {
	ctx    context.Context
	cancel context.CancelFunc
	st     pb.Node_ConnectPortClient

	rbuf []byte
	rerr error

	wmu   sync.Mutex
	wdone bool
}

func (p *portConn) Read(b []byte) (int, error) {
	for len(p.rbuf) == 0 {
		if p.rerr != nil {
			return 0, p.rerr
		}
		m, err := p.st.Recv()
		switch {
		case err == io.EOF:
			// The call ended without the port's half-close: it failed.
			p.rerr = io.ErrUnexpectedEOF
		case err != nil:
			p.rerr = fromStatus(p.ctx, "connect_port", err)
		case m.GetCloseWrite():
			p.rerr = io.EOF
		default:
			p.rbuf = m.GetData()
		}
	}
	n := copy(b, p.rbuf)
	p.rbuf = p.rbuf[n:]
	return n, nil
}

func (p *portConn) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.wdone {
		return 0, errors.New("grpcnode connect_port: write after CloseWrite")
	}
	written := 0
	for len(b) > 0 {
		n := min(len(b), portChunk)
		if err := p.st.Send(&pb.PortClientMessage{Message: &pb.PortClientMessage_Data{Data: b[:n]}}); err != nil {
			if err == io.EOF {
				// The node ended the call; Read reports its status (a
				// second Recv here would race with the reader's).
				return written, errors.New("grpcnode connect_port: the connection ended")
			}
			return written, fromStatus(p.ctx, "connect_port", err)
		}
		written += n
		b = b[n:]
	}
	return written, nil
}

func (p *portConn) CloseWrite() error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.wdone {
		return nil
	}
	p.wdone = true
	return fromStatus(p.ctx, "connect_port", p.st.CloseSend())
}

// Close aborts the call (the node closes the connection to the port).
func (p *portConn) Close() error {
	p.cancel()
	return nil
}
