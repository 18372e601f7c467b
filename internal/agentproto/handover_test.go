package agentproto

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestHandover: what a session writes after the other side's handover is
// dropped up to the marker; what an old session's waiting read got is the
// next session's; an old session can neither read nor write, and its Close
// leaves the connection open.
func TestHandover(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	nonce := bytes.Repeat([]byte{7}, NonceSize)
	ho := NewHandover(a)
	old := ho.Session()

	// An old session's read is waiting on the connection when the
	// handover happens.
	got := make(chan error, 1)
	go func() {
		_, err := old.Read(make([]byte, 64))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	next, err := ho.Next(nil, MarkerToHost(nonce))
	if err != nil {
		t.Fatal(err)
	}
	// The peer: bytes of its old session (a partial marker among them),
	// the marker, then the new session's bytes.
	m := MarkerToHost(nonce)
	go func() {
		_, _ = b.Write([]byte("old frames"))
		_, _ = b.Write(m[:5])
		_, _ = b.Write([]byte("more old"))
		_, _ = b.Write(append(append([]byte{}, m...), []byte("new session")...))
	}()
	if err := <-got; !errors.Is(err, ErrHandedOver) {
		t.Fatalf("old read: %v", err)
	}
	buf := make([]byte, len("new session"))
	if _, err := io.ReadFull(next, buf); err != nil || string(buf) != "new session" {
		t.Fatalf("next read %q, %v", buf, err)
	}
	if _, err := old.Write([]byte("x")); !errors.Is(err, ErrHandedOver) {
		t.Fatalf("old write: %v", err)
	}
	if _, err := old.Read(buf); !errors.Is(err, ErrHandedOver) {
		t.Fatalf("old read after: %v", err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = next.Write([]byte("ok")) }()
	if _, err := io.ReadFull(b, buf[:2]); err != nil || string(buf[:2]) != "ok" {
		t.Fatalf("the connection after the old session's close: %q, %v", buf[:2], err)
	}

	// Next with a marker to send writes it; Sync waits for the expected
	// one.
	third := make(chan *Session, 1)
	go func() {
		s, err := ho.Next(MarkerToAgent(nonce), MarkerToHost(nonce))
		if err != nil {
			t.Error(err)
		}
		third <- s
	}()
	want := MarkerToAgent(nonce)
	if _, err := io.ReadFull(b, make([]byte, len(want))); err != nil {
		t.Fatal(err)
	}
	s := <-third
	synced := make(chan error, 1)
	go func() { synced <- s.Sync() }()
	go func() { _, _ = b.Write(append([]byte("junk"), MarkerToHost(nonce)...)) }()
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := s.Read(buf); err == nil {
		t.Fatal("read of a closed connection succeeded")
	}
}

// TestHandoverFreeze: what a frozen session's read gets (the peer's marker,
// sent once it saw the request the frozen session wrote) is the next
// session's, and the frozen read fails only once Next is called.
func TestHandoverFreeze(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	nonce := bytes.Repeat([]byte{8}, NonceSize)
	ho := NewHandover(a)
	old := ho.Session()
	got := make(chan error, 1)
	go func() {
		_, err := old.Read(make([]byte, 64))
		got <- err
	}()
	ho.Freeze()
	go func() {
		// The peer reads the request, then answers with its marker.
		buf := make([]byte, 7)
		_, _ = io.ReadFull(b, buf)
		_, _ = b.Write(MarkerToHost(nonce))
	}()
	if _, err := old.Write([]byte("request")); err != nil {
		t.Fatalf("a frozen session's write: %v", err)
	}
	select {
	case err := <-got:
		t.Fatalf("a frozen session's read returned before Next: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	next, err := ho.Next(nil, MarkerToHost(nonce))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, ErrHandedOver) {
		t.Fatalf("frozen read after Next: %v", err)
	}
	if err := next.Sync(); err != nil {
		t.Fatalf("the marker the frozen read took is not the next session's: %v", err)
	}
}

// TestSuspendOfAStuckAgent: an agent that never answers (stopped by a
// signal from inside) holds a suspend only until its context ends, and
// the client closes after it.
func TestSuspendOfAStuckAgent(t *testing.T) {
	host, agent := net.Pipe()
	defer agent.Close()
	go func() { _, _ = io.Copy(io.Discard, agent) }() // reads, never answers
	c, err := Dial(host)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := c.Suspend(ctx, bytes.Repeat([]byte{4}, NonceSize)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("suspend of a stuck agent: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("the suspend took %v", d)
	}
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs after a failed suspend")
	}
	if err := c.Ping(context.Background()); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("ping after: %v", err)
	}
}
