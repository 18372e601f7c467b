package grpcnode

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi"
)

// flowNode produces and consumes without end, counting, so that a test
// sees how far one side runs ahead of the other.
type flowNode struct {
	fakeNode
	produced atomic.Int64 // bytes the node produced (download, output)
	closed   chan struct{}
}

type countingZeros struct {
	n      *atomic.Int64
	closed chan struct{}
}

func (z countingZeros) Read(p []byte) (int, error) {
	clear(p)
	z.n.Add(int64(len(p)))
	return len(p), nil
}

func (z countingZeros) Close() error { close(z.closed); return nil }

func (f *flowNode) OpenFile(ctx context.Context, id, path string) (nodeapi.FileInfo, io.ReadCloser, error) {
	return nodeapi.FileInfo{Name: "f", Size: 1 << 40}, countingZeros{&f.produced, f.closed}, nil
}

func (f *flowNode) Exec(ctx context.Context, id string, req nodeapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	buf := make([]byte, 64<<10)
	for ctx.Err() == nil {
		if _, err := stdout.Write(buf); err != nil {
			return nodeapi.ExitInfo{}, err
		}
		f.produced.Add(int64(len(buf)))
	}
	return nodeapi.ExitInfo{}, ctx.Err()
}

// WriteFile takes 1 MiB, then stops reading until the call ends.
func (f *flowNode) WriteFile(ctx context.Context, id, path string, r io.Reader, opts nodeapi.WriteOptions) (nodeapi.FileInfo, error) {
	if _, err := io.CopyN(io.Discard, r, 1<<20); err != nil {
		return nodeapi.FileInfo{}, err
	}
	<-ctx.Done()
	return nodeapi.FileInfo{}, ctx.Err()
}

// bound is how far a side may run ahead: the HTTP/2 windows and a few
// chunks, far below the transfers here.
const bound = 48 << 20

// TestFlowControl: a slow reader holds back a download and a command's
// output, a slow node an upload: nothing is buffered whole.
func TestFlowControl(t *testing.T) {
	f := &flowNode{closed: make(chan struct{})}
	c := dial(t, serve(t, f, ServerConfig{}), ClientConfig{})

	_, rc, err := c.OpenFile(t.Context(), "sb", "/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, rc, 1<<20); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	t.Logf("download: the node read %d KiB for a reader that took 1 MiB", f.produced.Load()>>10)
	if p := f.produced.Load(); p > bound {
		t.Errorf("download: the node read %d MiB ahead of a reader that took 1 MiB", p>>20)
	}
	rc.Close()
	select {
	case <-f.closed:
	case <-time.After(10 * time.Second):
		t.Error("closing the download did not close the node's reader")
	}

	f.produced.Store(0)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "sb", nodeapi.ExecRequest{Shell: "yes"}, nil, blockedWriter{ctx}, nil)
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	t.Logf("exec: the node wrote %d KiB for a client that reads nothing", f.produced.Load()>>10)
	if p := f.produced.Load(); p > bound {
		t.Errorf("exec: the node wrote %d MiB for a client that reads nothing", p>>20)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("exec after cancel: %v", err)
	}

	var read atomic.Int64
	ctx, cancel = context.WithCancel(t.Context())
	go func() {
		_, err := c.WriteFile(ctx, "sb", "/f", countingReader{&read}, nodeapi.WriteOptions{})
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	t.Logf("upload: the client read %d KiB for a node that took 1 MiB", read.Load()>>10)
	if r := read.Load(); r > bound+(1<<20) {
		t.Errorf("upload: the client read %d MiB of its source for a node that took 1 MiB", r>>20)
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("a cancelled upload succeeded")
	}
}

// blockedWriter blocks until ctx ends: a client that does not read.
type blockedWriter struct{ ctx context.Context }

func (w blockedWriter) Write(p []byte) (int, error) { <-w.ctx.Done(); return 0, w.ctx.Err() }

type countingReader struct{ n *atomic.Int64 }

func (r countingReader) Read(p []byte) (int, error) { r.n.Add(int64(len(p))); return len(p), nil }
