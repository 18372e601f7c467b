package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// HeaderSize is the size of a frame header: kind (1 byte) and payload
// length (uint32, big endian).
const HeaderSize = 5

// ErrFrameTooLarge is returned when a frame announces or carries a payload
// longer than MaxFrame.
var ErrFrameTooLarge = errors.New("agentproto: frame payload larger than MaxFrame")

// PutHeader writes a frame header for a payload of n bytes into
// buf[:HeaderSize]. It lets a sender read a payload straight into
// buf[HeaderSize:] and send header and payload with one Write.
func PutHeader(buf []byte, kind byte, n int) {
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:HeaderSize], uint32(n))
}

// AppendFrame appends one frame to dst and returns the extended slice.
func AppendFrame(dst []byte, kind byte, payload []byte) []byte {
	var hdr [HeaderSize]byte
	PutHeader(hdr[:], kind, len(payload))
	dst = append(dst, hdr[:]...)
	return append(dst, payload...)
}

// WriteFrame writes one frame with a single Write call, so that frames
// written concurrently to a stream whose Write is atomic (a yamux stream)
// never interleave.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return ErrFrameTooLarge
	}
	_, err := w.Write(AppendFrame(make([]byte, 0, HeaderSize+len(payload)), kind, payload))
	return err
}

// WriteJSON writes one frame whose payload is v encoded as JSON.
func WriteJSON(w io.Writer, kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agentproto: encode frame: %w", err)
	}
	return WriteFrame(w, kind, b)
}

// ReadHeader reads one frame header and returns the kind and payload
// length. It returns io.EOF if the stream ends cleanly before the header,
// io.ErrUnexpectedEOF if it ends inside it, and ErrFrameTooLarge if the
// announced length is above MaxFrame.
func ReadHeader(r io.Reader) (kind byte, n int, err error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, err
	}
	size := binary.BigEndian.Uint32(hdr[1:])
	if size > MaxFrame {
		return 0, 0, ErrFrameTooLarge
	}
	return hdr[0], int(size), nil
}

// ReadFrame reads one frame. The payload is read into buf when it fits
// (pass a buffer of MaxFrame bytes to never allocate) and is only valid
// until buf is reused. Errors are those of ReadHeader, and
// io.ErrUnexpectedEOF if the stream ends inside the payload.
func ReadFrame(r io.Reader, buf []byte) (kind byte, payload []byte, err error) {
	kind, n, err := ReadHeader(r)
	if err != nil {
		return 0, nil, err
	}
	if n > cap(buf) {
		buf = make([]byte, n)
	}
	payload = buf[:n]
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return kind, payload, nil
}
