package agent

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/evalbox/evalbox/internal/agentproto"
)

// connectTimeout bounds the dial of OpConnect: a port with nothing behind
// it answers at once on loopback, so this is only for a sandbox too busy
// to answer.
const connectTimeout = 10 * time.Second

// opConnect connects to a port on the sandbox's loopback and carries the
// connection's bytes over the stream both ways (agentproto's OpConnect):
// how the host reaches a server in the sandbox without any inbound path
// into its network. It answers the final frames itself.
func (s *server) opConnect(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	if req.Port < 1 || req.Port > 65535 {
		return fail(errorf(agentproto.CodeBadRequest, "port %d: want 1 to 65535", req.Port))
	}
	conn, err := dialLoopback(req.Port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fail(errorf(agentproto.CodeConnRefused, "nothing listens on port %d", req.Port))
		}
		return fail(errorf(agentproto.CodeInternal, "connect to port %d: %v", req.Port, err))
	}
	defer conn.Close()
	if err := agentproto.WriteJSON(st, agentproto.KindResponse, &agentproto.Response{}); err != nil {
		return nil
	}
	var (
		wg      sync.WaitGroup
		writeMu sync.Mutex // the stream's writes: data, the end, an error
		// Which sides ended (sent KindEnd): once both did, the reader,
		// which after the host's end only watches for an abort, is let go.
		endMu                sync.Mutex
		hostEnded, portEnded bool
	)
	// Host → port. The host's end is a half-close; a stream that ends
	// without it (closed, the session gone), before or after it, aborts
	// the connection.
	wg.Go(func() {
		buf := make([]byte, agentproto.ChunkSize)
		for {
			kind, n, err := agentproto.ReadHeader(st)
			if err != nil {
				conn.Close()
				return
			}
			switch {
			case kind == agentproto.KindData && !hostEnded && n <= len(buf):
				if _, err := io.ReadFull(st, buf[:n]); err != nil {
					conn.Close()
					return
				}
				if _, err := conn.Write(buf[:n]); err != nil {
					// The connection failed; its reader reports it, and
					// ends this one.
					st.SetReadDeadline(time.Now())
				}
			case kind == agentproto.KindEnd && !hostEnded:
				_ = conn.CloseWrite()
				endMu.Lock()
				hostEnded = true
				done := portEnded
				endMu.Unlock()
				if done {
					return
				}
			default:
				conn.Close()
				return
			}
		}
	})
	// Port → host.
	bufp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bufp)
	buf := (*bufp)[:agentproto.HeaderSize+sendChunk]
	for {
		n, err := conn.Read(buf[agentproto.HeaderSize:])
		if n > 0 {
			agentproto.PutHeader(buf, agentproto.KindData, n)
			writeMu.Lock()
			_, werr := st.Write(buf[:agentproto.HeaderSize+n])
			writeMu.Unlock()
			if werr != nil {
				conn.Close()
				st.SetReadDeadline(time.Now())
				break
			}
		}
		if err == io.EOF {
			writeMu.Lock()
			_ = agentproto.WriteFrame(st, agentproto.KindEnd, nil)
			writeMu.Unlock()
			endMu.Lock()
			portEnded = true
			done := hostEnded
			endMu.Unlock()
			if done {
				st.SetReadDeadline(time.Now())
			}
			break
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				writeMu.Lock()
				_ = agentproto.WriteJSON(st, agentproto.KindResponse, fail(errorf(agentproto.CodeInternal, "port %d: %v", req.Port, err)))
				writeMu.Unlock()
			}
			conn.Close()
			// Nothing more goes to the port: stop reading the host.
			st.SetReadDeadline(time.Now())
			break
		}
	}
	wg.Wait()
	return nil
}

// dialLoopback connects to port on 127.0.0.1, or on ::1 when nothing
// listens on the IPv4 loopback.
func dialLoopback(port int) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: connectTimeout}
	c, err := d.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		c6, err6 := d.Dial("tcp6", net.JoinHostPort("::1", strconv.Itoa(port)))
		if err6 != nil {
			return nil, err
		}
		c = c6
	}
	return c.(*net.TCPConn), nil
}
