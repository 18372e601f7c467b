package agentproto

import (
	"context"
	"sync"
)

// Connect connects to port on the sandbox's loopback (OpConnect) and
// returns the connection. Its reads are what the port's server sends (EOF
// once it closed its side), its writes go to that server; CloseWrite
// half-closes it and Close aborts it. An error that is an *Error with
// CodeConnRefused says nothing listens there. ctx governs the connection
// until Close, which must be called.
func (c *Client) Connect(ctx context.Context, port int) (*Conn, error) {
	k, err := c.open(ctx, &Request{Op: OpConnect, Port: port})
	if err != nil {
		return nil, err
	}
	if _, err := k.readResponse(nil, nil); err != nil {
		k.finish()
		return nil, err
	}
	return &Conn{r: fileReader{k: k}, wbuf: make([]byte, HeaderSize+ChunkSize)}, nil
}

// Conn is a connection to a port in the sandbox (Connect). Read and Write
// may be called from different goroutines; each from one at a time.
type Conn struct {
	r fileReader // KindData frames until KindEnd (or the agent's error)

	wmu    sync.Mutex
	wbuf   []byte
	wdone  bool
	closed sync.Once
}

// Read reads what the port's server sent.
func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Write sends p to the port's server.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wdone {
		return 0, c.r.k.err(errWriteClosed)
	}
	written := 0
	for len(p) > 0 {
		n := copy(c.wbuf[HeaderSize:], p)
		PutHeader(c.wbuf, KindData, n)
		if _, err := c.r.k.st.Write(c.wbuf[:HeaderSize+n]); err != nil {
			return written, c.r.k.err(err)
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// CloseWrite tells the port's server that nothing more comes (its read
// sees EOF); its answer still arrives.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wdone {
		return nil
	}
	c.wdone = true
	if err := WriteFrame(c.r.k.st, KindEnd, nil); err != nil {
		return c.r.k.err(err)
	}
	return nil
}

// Close ends the connection (aborting it if it is still open both ways).
func (c *Conn) Close() error {
	c.closed.Do(c.r.k.finish)
	return nil
}

type connError string

func (e connError) Error() string { return string(e) }

const errWriteClosed = connError("write after CloseWrite")
