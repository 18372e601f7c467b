package api

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// closedAfter is a body that fails any read once its content is gone, as
// net/http's server's body does after the handler (or the server) closed
// it.
type closedAfter struct {
	r     io.Reader
	reads int
}

func (c *closedAfter) Read(p []byte) (int, error) {
	c.reads++
	n, err := c.r.Read(p)
	if n == 0 && err == io.EOF {
		return 0, errors.New("http: invalid Read on closed Body")
	}
	return n, err
}

func (c *closedAfter) Close() error { return nil }

// TestSizedBody: a body of known length ends after it without another
// read of what it wraps (the transport's read past Content-Length must
// not reach a server body that may be closed by then), and a body
// shorter than its length is an error.
func TestSizedBody(t *testing.T) {
	src := &closedAfter{r: strings.NewReader("0123456789")}
	b := &sizedBody{r: src, left: 10}
	got, err := io.ReadAll(io.LimitReader(b, 10))
	if err != nil || string(got) != "0123456789" {
		t.Fatalf("the body: %q, %v", got, err)
	}
	reads := src.reads
	if n, err := b.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Errorf("a read past the end: %d, %v; want 0, EOF", n, err)
	}
	if src.reads != reads {
		t.Errorf("a read past the end reached the wrapped body")
	}

	short := &sizedBody{r: io.NopCloser(strings.NewReader("abc")), left: 10}
	if _, err := io.ReadAll(short); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a body shorter than its length: %v, want unexpected EOF", err)
	}

	// Close leaves the server's body to the server (closing it before its
	// end would cost the client its connection).
	rc := &closeCounter{Reader: strings.NewReader("x")}
	if err := (&sizedBody{r: rc, left: -1}).Close(); err != nil || rc.closed {
		t.Errorf("Close closed the server's body (%v)", err)
	}
	if got, _ := io.ReadAll(&sizedBody{r: strings.NewReader("unknown length"), left: -1}); string(got) != "unknown length" {
		t.Errorf("a body of unknown length: %q", got)
	}

	// A read asks the wrapped body for no more than what is left.
	long := &sizedBody{r: io.NopCloser(strings.NewReader("abcdefgh")), left: 3}
	if got, err := io.ReadAll(long); err != nil || string(got) != "abc" {
		t.Errorf("a body longer than its length: %q, %v", got, err)
	}
}

type closeCounter struct {
	io.Reader
	closed bool
}

func (c *closeCounter) Close() error { c.closed = true; return nil }
