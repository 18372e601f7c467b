package outbuf

import (
	"io"
	"unicode/utf8"
)

// escaper writes bytes as the inside of a JSON string, escaped exactly as
// encoding/json escapes a Go string (HTML characters, control characters,
// U+2028/U+2029, invalid UTF-8 as \ufffd), in bounded memory. Bytes come in
// pieces: a UTF-8 sequence cut between two pieces is held back (pend) until
// it is whole, so that the result is the one of the whole content.
type escaper struct {
	w    io.Writer
	buf  []byte
	pend [utf8.UTFMax]byte
	np   int
	err  error
}

const escFlush = 32 << 10

const hexDigits = "0123456789abcdef"

// raw appends s unescaped.
func (e *escaper) raw(s string) {
	e.buf = append(e.buf, s...)
}

// spill writes out the buffer once it holds more than limit bytes.
func (e *escaper) spill(limit int) {
	if len(e.buf) <= limit || e.err != nil {
		return
	}
	_, e.err = e.w.Write(e.buf)
	e.buf = e.buf[:0]
}

// write escapes p, holding back an unfinished UTF-8 sequence at its end.
func (e *escaper) write(p []byte) {
	for len(p) > 0 && e.np > 0 {
		// Complete the held-back sequence with p's first bytes.
		k := copy(e.pend[e.np:], p)
		seq := e.pend[:e.np+k]
		if !utf8.FullRune(seq) {
			e.np += k
			return
		}
		_, size := utf8.DecodeRune(seq)
		e.escape(seq[:size])
		if used := size - e.np; used >= 0 {
			p = p[used:]
			e.np = 0
		} else {
			// An invalid first byte: what followed it is held back again.
			e.np = copy(e.pend[:], e.pend[size:e.np])
		}
	}
	if len(p) == 0 {
		return
	}
	cut := complete(p)
	e.escape(p[:cut])
	e.np = copy(e.pend[:], p[cut:])
}

// flush escapes what is held back (at the end of the content: an unfinished
// sequence is invalid) and writes everything out.
func (e *escaper) flush() {
	e.escape(e.pend[:e.np])
	e.np = 0
}

// complete returns the length of the longest prefix of b that does not end
// inside a UTF-8 sequence that more bytes could finish.
func complete(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}

// escape appends src escaped (src holds no unfinished sequence at its end,
// or it is the end of the content), as encoding/json's appendString does.
func (e *escaper) escape(src []byte) {
	start := 0
	for i := 0; i < len(src); {
		if b := src[i]; b < utf8.RuneSelf {
			if htmlSafe(b) {
				i++
				if i-start >= escFlush {
					e.buf = append(e.buf, src[start:i]...)
					start = i
					e.spill(escFlush)
				}
				continue
			}
			e.buf = append(e.buf, src[start:i]...)
			switch b {
			case '\\', '"':
				e.buf = append(e.buf, '\\', b)
			case '\b':
				e.buf = append(e.buf, '\\', 'b')
			case '\f':
				e.buf = append(e.buf, '\\', 'f')
			case '\n':
				e.buf = append(e.buf, '\\', 'n')
			case '\r':
				e.buf = append(e.buf, '\\', 'r')
			case '\t':
				e.buf = append(e.buf, '\\', 't')
			default:
				e.buf = append(e.buf, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			e.spill(escFlush)
			continue
		}
		c, size := utf8.DecodeRune(src[i:])
		if c == utf8.RuneError && size == 1 {
			e.buf = append(e.buf, src[start:i]...)
			e.buf = append(e.buf, `\ufffd`...)
			i++
			start = i
			e.spill(escFlush)
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			e.buf = append(e.buf, src[start:i]...)
			e.buf = append(e.buf, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			e.spill(escFlush)
			continue
		}
		i += size
		if i-start >= escFlush {
			e.buf = append(e.buf, src[start:i]...)
			start = i
			e.spill(escFlush)
		}
	}
	e.buf = append(e.buf, src[start:]...)
	e.spill(escFlush)
}

// htmlSafe reports whether ASCII byte b is written as itself by
// encoding/json (with its default HTML escaping).
func htmlSafe(b byte) bool {
	return b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
}
