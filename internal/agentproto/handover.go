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
//	agent → host   MarkerToHost          the agent's old session is over;
//	                                     its next session reads only what
//	                                     follows MarkerToAgent
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

// Handover carries successive sessions over one connection. The current
// session's connection is Session; Next starts the next one, after which
// reads and writes of the previous one fail with ErrHandedOver, and what
// the previous one had read but not yet returned is the next one's.
type Handover struct {
	conn io.ReadWriteCloser
	gen  atomic.Uint64

	rmu     sync.Mutex // one read of conn at a time; guards what follows
	pending []byte     // read from conn, not yet returned to a session
	readErr error      // conn's read error, once it failed
	// frozen, while set, holds what the current session reads back for
	// the next one (Freeze); Next closes it. Guarded by fmu (not wmu: a
	// write blocked on a full pipe must not stop the reads).
	fmu    sync.Mutex
	frozen chan struct{}

	wmu sync.Mutex // writes of conn, and Next's switch
}

// NewHandover wraps conn, whose first session starts at once.
func NewHandover(conn io.ReadWriteCloser) *Handover { return &Handover{conn: conn} }

// Session returns the connection of the current session.
func (h *Handover) Session() *Session { return &Session{h: h, gen: h.gen.Load()} }

// Freeze stops the current session from reading: what comes from now on
// is kept for the next session, and a read of the current one waits for
// Next (then fails with ErrHandedOver). Its writes still go out. The host
// freezes before it sends OpSuspend, so that its session cannot take the
// agent's marker for a frame.
func (h *Handover) Freeze() {
	h.fmu.Lock()
	defer h.fmu.Unlock()
	if h.frozen == nil {
		h.frozen = make(chan struct{})
	}
}

// Next ends the current session and returns the connection of the next
// one: it writes send (if any) and, when expect is set, the next session
// reads only what comes after expect. The old session's reads and writes
// fail from now on (a read waiting on the connection fails once bytes
// come, which are then the next session's), and its Close leaves the
// connection open.
func (h *Handover) Next(send, expect []byte) (*Session, error) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.fmu.Lock()
	s := &Session{h: h, gen: h.gen.Add(1), expect: expect}
	if h.frozen != nil {
		close(h.frozen)
		h.frozen = nil
	}
	h.fmu.Unlock()
	if len(send) > 0 {
		if _, err := h.conn.Write(send); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close closes the connection.
func (h *Handover) Close() error { return h.conn.Close() }

// Session is one session's connection over a Handover.
type Session struct {
	h   *Handover
	gen uint64
	// expect: the session reads only what follows it (nil once found);
	// seen is the tail of what was read while looking for it. Both are
	// used under h.rmu.
	expect, seen []byte
}

func (s *Session) stale() bool { return s.h.gen.Load() != s.gen }

// Sync reads up to the marker the session expects (Next's expect),
// blocking until it has come or the connection fails.
func (s *Session) Sync() error {
	s.h.rmu.Lock()
	defer s.h.rmu.Unlock()
	if s.stale() {
		return ErrHandedOver
	}
	return s.awaitLocked()
}

// awaitLocked reads and drops what comes before s.expect.
func (s *Session) awaitLocked() error {
	h := s.h
	var buf []byte
	for s.expect != nil {
		data := append(s.seen, h.pending...)
		h.pending = nil
		if i := bytes.Index(data, s.expect); i >= 0 {
			h.pending = data[i+len(s.expect):]
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
		if buf == nil {
			buf = make([]byte, 32<<10)
		}
		n, err := h.conn.Read(buf)
		h.pending = append(h.pending, buf[:n]...)
		if err != nil {
			h.readErr = err
		}
		if s.stale() {
			return ErrHandedOver
		}
	}
	return nil
}

func (s *Session) Read(p []byte) (int, error) {
	h := s.h
	h.rmu.Lock()
	if s.stale() {
		h.rmu.Unlock()
		return 0, ErrHandedOver
	}
	if err := s.awaitLocked(); err != nil {
		h.rmu.Unlock()
		return 0, err
	}
	if frozen := s.frozen(); frozen != nil {
		h.rmu.Unlock()
		<-frozen
		return 0, ErrHandedOver
	}
	if len(h.pending) > 0 {
		n := copy(p, h.pending)
		h.pending = h.pending[n:]
		h.rmu.Unlock()
		return n, nil
	}
	if h.readErr != nil {
		h.rmu.Unlock()
		return 0, h.readErr
	}
	n, err := h.conn.Read(p)
	frozen := s.frozen()
	if s.stale() || frozen != nil {
		// Next (or Freeze) was called while this read waited: what it
		// read is the next session's.
		h.pending = append(h.pending, p[:n]...)
		if err != nil {
			h.readErr = err
		}
		h.rmu.Unlock()
		if frozen != nil {
			<-frozen
		}
		return 0, ErrHandedOver
	}
	h.rmu.Unlock()
	return n, err
}

// frozen returns the channel Next closes while the session is frozen (nil
// when it is not).
func (s *Session) frozen() chan struct{} {
	s.h.fmu.Lock()
	defer s.h.fmu.Unlock()
	if s.stale() {
		return nil
	}
	return s.h.frozen
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
	return s.h.conn.Close()
}
