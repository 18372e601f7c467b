package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	big := bytes.Repeat([]byte{7}, MaxFrame)
	if err := WriteFrame(&buf, KindStdout, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFrame(&buf, KindEnd, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteFrame(&buf, KindData, big); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&buf, KindRequest, &Request{Op: OpPing}); err != nil {
		t.Fatal(err)
	}

	rbuf := make([]byte, 16)
	kind, p, err := ReadFrame(&buf, rbuf)
	if err != nil || kind != KindStdout || string(p) != "hello" || &p[0] != &rbuf[0] {
		t.Fatalf("frame 1: %q %q %v (must reuse the buffer)", kind, p, err)
	}
	if kind, p, err = ReadFrame(&buf, rbuf); err != nil || kind != KindEnd || len(p) != 0 {
		t.Fatalf("frame 2: %q %q %v", kind, p, err)
	}
	if kind, p, err = ReadFrame(&buf, rbuf); err != nil || kind != KindData || !bytes.Equal(p, big) {
		t.Fatalf("frame 3: %q %d bytes %v", kind, len(p), err)
	}
	if kind, p, err = ReadFrame(&buf, nil); err != nil || kind != KindRequest || string(p) != `{"op":"ping"}` {
		t.Fatalf("frame 4: %q %q %v", kind, p, err)
	}
	if _, _, err = ReadFrame(&buf, nil); err != io.EOF {
		t.Fatalf("clean end: %v, want io.EOF", err)
	}
}

func TestFrameLimits(t *testing.T) {
	if err := WriteFrame(io.Discard, KindData, make([]byte, MaxFrame+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("write oversized: %v", err)
	}
	var hdr [HeaderSize]byte
	hdr[0] = KindData
	binary.BigEndian.PutUint32(hdr[1:], MaxFrame+1)
	if _, _, err := ReadFrame(bytes.NewReader(hdr[:]), nil); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("read oversized: %v", err)
	}

	// Truncated header and truncated payload.
	if _, _, err := ReadFrame(bytes.NewReader(hdr[:3]), nil); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut header: %v", err)
	}
	frame := AppendFrame(nil, KindStdin, []byte("abcdef"))
	if _, _, err := ReadFrame(bytes.NewReader(frame[:len(frame)-2]), nil); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut payload: %v", err)
	}
	if _, _, err := ReadFrame(bytes.NewReader(frame[:HeaderSize]), nil); err != io.ErrUnexpectedEOF {
		t.Fatalf("missing payload: %v", err)
	}
}

// countingWriter counts Write calls.
type countingWriter struct {
	calls int
	bytes.Buffer
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.calls++
	return w.Buffer.Write(p)
}

func TestFrameSingleWrite(t *testing.T) {
	// Frames from concurrent writers must not interleave on a stream whose
	// Write is atomic: each frame is exactly one Write.
	var w countingWriter
	WriteFrame(&w, KindStdout, []byte("x"))
	WriteJSON(&w, KindResponse, &Response{})
	if w.calls != 2 {
		t.Fatalf("%d writes for 2 frames", w.calls)
	}
}
