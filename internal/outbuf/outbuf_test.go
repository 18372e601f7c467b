package outbuf

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestWriteJSONString checks the streamed escaping against encoding/json on
// random content written in random pieces: control bytes, HTML characters,
// multi-byte and invalid UTF-8, U+2028, cut anywhere.
func TestWriteJSONString(t *testing.T) {
	alphabet := [][]byte{{0}, {'\n'}, {'\b'}, {'\f'}, {0x1f}, {'"'}, {'\\'}, {'<'}, {'&'}, {'a'}, {'z'},
		[]byte("é"), []byte("€"), []byte("𝄞"), []byte("\u2028"), []byte("\u2029"), {0xff}, {0xe2, 0x82}, {0x80}, {0xf0}, []byte("\ufffd")}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		var content []byte
		for range rng.IntN(200) {
			content = append(content, alphabet[rng.IntN(len(alphabet))]...)
		}
		if round%200 == 0 {
			content = append(content, bytes.Repeat([]byte{0}, 3*maxChunk)...)
			content = append(content, bytes.Repeat([]byte("x€"), maxChunk)...)
		}
		b, err := New(nil, Fail)
		if err != nil {
			t.Fatal(err)
		}
		for p := content; len(p) > 0; {
			k := min(len(p), 1+rng.IntN(7))
			if rng.IntN(10) == 0 || len(p) > 1000 {
				k = min(len(p), rng.IntN(100000))
			}
			if _, err := b.Write(p[:k]); err != nil {
				t.Fatal(err)
			}
			p = p[k:]
		}
		var got bytes.Buffer
		if err := b.WriteJSONString(&got); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(string(content))
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("round %d: content %q\n got %.200q\nwant %.200q", round, content[:min(len(content), 200)], got.Bytes(), want)
		}
		if b.Len() != int64(len(content)) || !bytes.Equal(b.Bytes(), content) {
			t.Fatalf("round %d: content not kept", round)
		}
	}
}

// TestBufferBudget: buffers reserve as they grow, Fail and Truncate act at
// the limit, and Release gives everything back.
func TestBufferBudget(t *testing.T) {
	budget := NewBudget(64 << 10)
	a, err := New(budget, Fail)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(make([]byte, 40<<10)); err != nil {
		t.Fatal(err)
	}
	reservedA := budget.Used()
	if reservedA < 40<<10 || reservedA > 64<<10 {
		t.Fatalf("reserved %d for 40 KiB", reservedA)
	}
	tr, err := New(budget, Truncate)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := tr.Write(make([]byte, 64<<10)); err != nil || n != 64<<10 || !tr.Dropped() {
		t.Fatalf("truncating write: %d %v dropped=%v", n, err, tr.Dropped())
	}
	if _, err := a.Write(make([]byte, 64<<10)); !errors.Is(err, ErrExhausted) {
		t.Fatalf("write past the budget: %v", err)
	}
	if budget.Used() > budget.Total() {
		t.Fatalf("used %d of %d", budget.Used(), budget.Total())
	}
	tr.Reset()
	if tr.Dropped() || tr.Len() != 0 || budget.Used() != reservedA+firstChunk {
		t.Fatalf("after Reset: dropped %v, len %d, used %d", tr.Dropped(), tr.Len(), budget.Used())
	}
	a.Release()
	tr.Release()
	a.Release()
	if budget.Used() != 0 {
		t.Fatalf("used %d after release", budget.Used())
	}
	full := NewBudget(firstChunk - 1)
	if _, err := New(full, Truncate); !errors.Is(err, ErrExhausted) {
		t.Fatalf("New on a spent budget: %v", err)
	}
}

// TestLease: a lease waits for room, never takes more than the budget, and
// buffers drawing on it stay within it.
func TestLease(t *testing.T) {
	budget := NewBudget(100 << 10)
	a, err := New(budget, Fail)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = a.Write(make([]byte, 50<<10))
	done := make(chan *Lease)
	go func() {
		l, err := budget.Lease(context.Background(), 1<<30) // clamped to the budget
		if err != nil {
			t.Error(err)
		}
		done <- l
	}()
	select {
	case <-done:
		t.Fatal("lease taken while the budget was in use")
	case <-time.After(50 * time.Millisecond):
	}
	a.Release()
	l := <-done
	if budget.Used() != budget.Total() {
		t.Fatalf("lease holds %d of %d", budget.Used(), budget.Total())
	}
	b, err := New(l, Truncate)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = b.Write([]byte(strings.Repeat("x", 200<<10)))
	if !b.Dropped() || b.Len() > 100<<10 {
		t.Fatalf("lease buffer held %d (dropped %v)", b.Len(), b.Dropped())
	}
	b.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := budget.Lease(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lease on a spent budget: %v", err)
	}
	l.Close()
	l.Close()
	if budget.Used() != 0 {
		t.Fatalf("used %d after close", budget.Used())
	}
}

// TestTally: buffers and direct reservations through a tally count against
// its budget, a refused reservation holds nothing, and ReleaseAll gives
// back what the buffers' own releases did not.
func TestTally(t *testing.T) {
	budget := NewBudget(64 << 10)
	tally := NewTally(budget)
	b, err := New(tally, Truncate)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = b.Write(make([]byte, 10<<10))
	if !tally.TryReserve(20 << 10) {
		t.Fatal("a file's reservation was refused with room left")
	}
	if tally.TryReserve(64 << 10) {
		t.Fatal("a reservation past the budget was granted")
	}
	if tally.Held() != budget.Used() || budget.Used() < 30<<10 {
		t.Fatalf("tally holds %d, budget used %d", tally.Held(), budget.Used())
	}
	b.Release()
	if tally.Held() != 20<<10 {
		t.Fatalf("after the buffer's release the tally holds %d, want the file's %d", tally.Held(), 20<<10)
	}
	tally.ReleaseAll()
	if tally.Held() != 0 || budget.Used() != 0 {
		t.Fatalf("after ReleaseAll: tally %d, budget %d", tally.Held(), budget.Used())
	}
}
