package agent

import (
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// TestDrainCountsTheChunkInHand: a pump that has read a whole chunk it has
// not yet counted (it is still forwarding it to a slow host) must not make
// drain cut a pipe that still holds what the exited process wrote.
func TestDrainCountsTheChunkInHand(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close() // a daemon's copy keeps the pipe open
	other, otherW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	otherW.Close() // the other stream is at EOF
	defer other.Close()
	const left = 40_000 // what the process left in the pipe when it exited
	if _, err := w.Write(make([]byte, left)); err != nil {
		t.Fatal(err)
	}
	var read [2]atomic.Int64
	pumped := make(chan struct{}, 2)
	pumped <- struct{}{} // the other pump has ended
	done := make(chan struct{})
	go func() {
		drain([2]*os.File{r, other}, &read, pumped)
		close(done)
	}()
	// The pump's chunk in hand (read from the pipe before drain began)
	// is counted only now, then it forwards it slowly, past the grace.
	time.Sleep(10 * time.Millisecond)
	read[0].Add(readChunk)
	time.Sleep(3 * pipeGrace)
	buf := make([]byte, readChunk)
	got := 0
	for got < left {
		n, err := r.Read(buf)
		got += n
		read[0].Add(int64(n))
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the pipe was cut with %d of %d bytes unread", left-got, left)
			}
			t.Fatal(err)
		}
	}
	pumped <- struct{}{}
	<-done
}
