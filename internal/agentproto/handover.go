package agentproto

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// # Handover
//
// One connection can carry successive sessions: the host suspends the
// agent's session (OpSuspend) before a snapshot and starts a new one after
// it, on the same connection (the sandbox kept running) or on a new one
// (a sandbox restored from the snapshot: the runtime gave the agent new
// stdin/stdout). Neither end can tell where the bytes of the old yamux
// session end (frames it had queued, a window update, a FIN), so each side
// writes a marker once its old session can write no more, and the other
// side's next session reads what follows the marker only. Each side stops
// its old session from reading before the other can send its marker (else
// the old yamux session could swallow it as a bad frame):
//
//	host  → agent  OpSuspend{Nonce}      (old session; the host's session
//	                                     reads nothing more once it is sent)
//	agent → host   MarkerToHost          the agent's old session is over
//	                                     (its streams cut, its foreground
//	                                     execs killed); its next session
//	                                     reads only what follows
//	                                     MarkerToAgent
//	host           reads up to MarkerToHost: the agent is quiet, the
//	               sandbox can be checkpointed
//	host  → agent  MarkerToAgent, then the new session (same connection, or
//	               the restored sandbox's new one)
//
// The markers carry the host's random nonce, so no byte sequence of an old
// session is mistaken for them.

// Markers of a handover: both start with this and end with the nonce.
var markerMagic = []byte("\x00EVALBOX-HANDOVER\x00")

// NonceSize is the size of OpSuspend's nonce.
const NonceSize = 16

// MarkerToAgent is what the host writes before a new session.
func MarkerToAgent(nonce []byte) []byte { return marker('A', nonce) }

// MarkerToHost is what the agent writes once its old session is over.
func MarkerToHost(nonce []byte) []byte { return marker('H', nonce) }

func marker(to byte, nonce []byte) []byte {
	m := append(append([]byte{}, markerMagic...), to)
	return append(m, nonce...)
}

// ErrHandedOver is the error of a read or write of a session after the
// connection was handed over to the next one.
var ErrHandedOver = errors.New("agentproto: session handed over")

// ringSize is the reader goroutine's buffer: what it reads ahead of the
// session (yamux's own flow control bounds what the peer sends). Fixed, so
// that the hot path allocates nothing.
const ringSize = 64 << 10

// Handover carries successive sessions over one connection. The current
// session's connection is Session; Next starts the next one, after which
// reads and writes of the previous one fail with ErrHandedOver at once.
// One goroutine reads the connection into a ring buffer: no read of a
// session that is over waits on it (a yamux session's Close waits for its
// reader to end).
type Handover struct {
	conn io.ReadWriteCloser
	gen  atomic.Uint64

	mu      sync.Mutex
	cond    *sync.Cond // signalled on data, room, an error, a handover, a close
	ring    []byte     // ringSize bytes; ring[r:r+n] (wrapping) is unread
	r, n    int
	carry   []byte // read past a marker, for the session after it (before the ring)
	readErr error  // conn's read error, once it failed
	frozen  bool   // Freeze: the current session reads nothing
	closed  bool

	wmu sync.Mutex // writes of conn, and Next's switch
}

// NewHandover wraps conn, whose first session starts at once.
func NewHandover(conn io.ReadWriteCloser) *Handover {
	h := &Handover{conn: conn, ring: make([]byte, ringSize)}
	h.cond = sync.NewCond(&h.mu)
	go h.pump()
	return h
}

// pump reads conn into the ring's free space until conn fails. The space
// it reads into is the consumers' only once it counted it in n.
func (h *Handover) pump() {
	for {
		h.mu.Lock()
		for h.n == len(h.ring) && !h.closed {
			h.cond.Wait()
		}
		if h.closed {
			h.mu.Unlock()
			return
		}
		w := (h.r + h.n) % len(h.ring)
		free := len(h.ring) - h.n
		if w+free > len(h.ring) {
			free = len(h.ring) - w
		}
		region := h.ring[w : w+free]
		h.mu.Unlock()
		k, err := h.conn.Read(region)
		h.mu.Lock()
		h.n += k
		if err != nil && h.readErr == nil {
			h.readErr = err
		}
		h.cond.Broadcast()
		h.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// takeLocked moves up to len(p) unread bytes (carry first) into p.
func (h *Handover) takeLocked(p []byte) int {
	if len(h.carry) > 0 {
		k := copy(p, h.carry)
		h.carry = h.carry[k:]
		if len(h.carry) == 0 {
			h.carry = nil
		}
		return k
	}
	k := 0
	for k < len(p) && h.n > 0 {
		end := min(h.r+h.n, len(h.ring))
		c := copy(p[k:], h.ring[h.r:end])
		k += c
		h.r = (h.r + c) % len(h.ring)
		h.n -= c
	}
	if k > 0 {
		h.cond.Broadcast() // room for the reader
	}
	return k
}

// unread reports whether bytes wait to be read (h.mu held).
func (h *Handover) unread() bool { return len(h.carry) > 0 || h.n > 0 }

// Session returns the connection of the current session.
func (h *Handover) Session() *Session { return &Session{h: h, gen: h.gen.Load()} }

// Freeze stops the current session from reading: what comes from now on
// is kept for the next session, and a read of the current one waits for
// Next (then fails with ErrHandedOver). Its writes still go out. The host
// freezes before it sends OpSuspend, so that its session cannot take the
// agent's marker for a frame.
func (h *Handover) Freeze() {
	h.mu.Lock()
	h.frozen = true
	h.mu.Unlock()
}

// Next ends the current session and returns the connection of the next
// one: it writes send (if any) and, when expect is set, the next session
// reads only what comes after expect. The old session's reads and writes
// fail from now on, and its Close leaves the connection open.
func (h *Handover) Next(send, expect []byte) (*Session, error) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.mu.Lock()
	s := &Session{h: h, gen: h.gen.Add(1), expect: expect}
	h.frozen = false
	h.cond.Broadcast()
	h.mu.Unlock()
	if len(send) > 0 {
		if _, err := h.conn.Write(send); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close closes the connection; reads waiting end.
func (h *Handover) Close() error {
	h.mu.Lock()
	h.closed = true
	if h.readErr == nil {
		h.readErr = io.ErrClosedPipe
	}
	h.cond.Broadcast()
	h.mu.Unlock()
	return h.conn.Close()
}

// Session is one session's connection over a Handover.
type Session struct {
	h   *Handover
	gen uint64
	// expect: the session reads only what follows it (nil once found);
	// seen is the tail of what was read while looking for it. Both are
	// used under h.mu.
	expect, seen []byte
}

func (s *Session) stale() bool { return s.h.gen.Load() != s.gen }

// Sync reads up to the marker the session expects (Next's expect),
// blocking until it has come or the connection fails.
func (s *Session) Sync() error {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	return s.awaitLocked()
}

// awaitLocked drops what comes before s.expect (h.mu held).
func (s *Session) awaitLocked() error {
	h := s.h
	var chunk []byte
	for s.expect != nil {
		if s.stale() {
			return ErrHandedOver
		}
		data := s.seen
		for h.unread() {
			if chunk == nil {
				chunk = make([]byte, 32<<10)
			}
			data = append(data, chunk[:h.takeLocked(chunk)]...)
		}
		if i := bytes.Index(data, s.expect); i >= 0 {
			if rest := data[i+len(s.expect):]; len(rest) > 0 {
				h.carry = append([]byte(nil), rest...)
			}
			s.expect, s.seen = nil, nil
			return nil
		}
		// Keep what could be the start of the marker.
		if keep := len(s.expect) - 1; len(data) > keep {
			data = data[len(data)-keep:]
		}
		s.seen = append([]byte{}, data...)
		if h.readErr != nil {
			return h.readErr
		}
		h.cond.Wait()
	}
	return nil
}

func (s *Session) Read(p []byte) (int, error) {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := s.awaitLocked(); err != nil {
		return 0, err
	}
	for {
		switch {
		case s.stale():
			return 0, ErrHandedOver
		case h.frozen:
		case h.unread():
			return h.takeLocked(p), nil
		case h.readErr != nil:
			return 0, h.readErr
		}
		h.cond.Wait()
	}
}

func (s *Session) Write(p []byte) (int, error) {
	h := s.h
	h.wmu.Lock()
	defer h.wmu.Unlock()
	if s.stale() {
		return 0, ErrHandedOver
	}
	return h.conn.Write(p)
}

// Close closes the connection, unless the session was handed over.
func (s *Session) Close() error {
	if s.stale() {
		return nil
	}
	return s.h.Close()
}
