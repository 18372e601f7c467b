package outbuf

import (
	"io"
	"sync"
)

// Chunk sizes: a Buffer's first chunk is small (most commands print little)
// and each next one doubles, up to maxChunk, so that what a Buffer holds
// reserved is at most twice its content plus one chunk.
const (
	firstChunk = 4 << 10
	maxChunk   = 1 << 20
)

// Mode says what a Buffer does when its Source has no more room.
type Mode int

const (
	// Fail makes Write return ErrExhausted (the caller answers 429; e.g. a
	// wait, which can be asked again).
	Fail Mode = iota
	// Truncate drops the rest of the output and notes it (Dropped): for a
	// command that runs on and must still answer with its result.
	Truncate
)

// Buffer is an io.Writer that keeps what is written in memory, in chunks,
// each reserved from its Source before it is allocated. Release gives every
// chunk back; a Buffer is used by one goroutine at a time.
type Buffer struct {
	src      Source
	mode     Mode
	chunks   [][]byte
	reserved int64 // of src: the capacity of every chunk (the first reserved ahead)
	size     int64
	dropped  bool
}

// New returns an empty Buffer that reserves from src (nil: no limit). The
// first chunk is reserved at once: New fails with ErrExhausted when even
// that is not free, so that the caller can refuse a request before it
// runs anything.
func New(src Source, mode Mode) (*Buffer, error) {
	b := &Buffer{src: src, mode: mode}
	if !b.reserve(firstChunk) {
		return nil, ErrExhausted
	}
	return b, nil
}

func (b *Buffer) reserve(n int64) bool {
	if b.src != nil && !b.src.TryReserve(n) {
		return false
	}
	b.reserved += n
	return true
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	n := len(p)
	if b.dropped {
		return n, nil
	}
	for len(p) > 0 {
		if len(b.chunks) == 0 || len(b.chunks[len(b.chunks)-1]) == cap(b.chunks[len(b.chunks)-1]) {
			if err := b.grow(); err != nil {
				if b.mode == Truncate {
					b.dropped = true
					return n, nil
				}
				return 0, err
			}
		}
		last := &b.chunks[len(b.chunks)-1]
		k := min(len(p), cap(*last)-len(*last))
		*last = append(*last, p[:k]...)
		p = p[k:]
		b.size += int64(k)
	}
	return n, nil
}

// grow adds a chunk, reserving it first (the first chunk was reserved by
// New).
func (b *Buffer) grow() error {
	size := int64(firstChunk)
	if len(b.chunks) > 0 {
		size = min(2*int64(cap(b.chunks[len(b.chunks)-1])), maxChunk)
		if !b.reserve(size) {
			return ErrExhausted
		}
	}
	b.chunks = append(b.chunks, getChunk(int(size)))
	return nil
}

// Chunks are pooled by size: a server refusing or finishing many large
// answers reuses the same memory instead of leaving garbage behind it, so
// that its heap stays near the budget rather than growing to twice it
// between collections.
var chunkPools [chunkClasses]sync.Pool

// chunkClasses is the number of chunk sizes: firstChunk << 0 … maxChunk.
const chunkClasses = 9

func chunkClass(size int) int {
	c := 0
	for s := firstChunk; s < size; s <<= 1 {
		c++
	}
	return c
}

func getChunk(size int) []byte {
	if p, ok := chunkPools[chunkClass(size)].Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, size)
}

func putChunk(c []byte) {
	if cl := chunkClass(cap(c)); cl < chunkClasses && firstChunk<<cl == cap(c) {
		c = c[:0]
		chunkPools[cl].Put(&c)
	}
}

// recycle gives the chunks back to the pools.
func (b *Buffer) recycle() {
	for _, c := range b.chunks {
		putChunk(c)
	}
	b.chunks = nil
}

// Len is the number of bytes held.
func (b *Buffer) Len() int64 { return b.size }

// Dropped reports whether output was dropped for want of room (Truncate).
func (b *Buffer) Dropped() bool { return b.dropped }

// Bytes returns a copy of the content (for small buffers).
func (b *Buffer) Bytes() []byte {
	out := make([]byte, 0, b.size)
	for _, c := range b.chunks {
		out = append(out, c...)
	}
	return out
}

// String returns a copy of the content as a string (for small buffers).
func (b *Buffer) String() string { return string(b.Bytes()) }

// WriteTo writes the content to w.
func (b *Buffer) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for _, c := range b.chunks {
		k, err := w.Write(c)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// WriteJSONString writes the content as one JSON string, quoted and escaped
// exactly as encoding/json escapes a Go string (invalid UTF-8 as U+FFFD),
// without building it in memory.
func (b *Buffer) WriteJSONString(w io.Writer) error {
	e := &escaper{w: w}
	e.raw(`"`)
	for _, c := range b.chunks {
		e.write(c)
	}
	e.flush()
	e.raw(`"`)
	e.spill(0)
	return e.err
}

// Reset empties the Buffer for new content (a retried attempt), keeping
// only its first chunk reserved.
func (b *Buffer) Reset() {
	if b.src != nil {
		b.src.Release(b.reserved - firstChunk)
	}
	b.recycle()
	b.reserved, b.size, b.dropped = firstChunk, 0, false
}

// Release gives the reserved memory back and empties the Buffer. It may be
// called more than once; what was written must no longer be in use (its
// memory is reused).
func (b *Buffer) Release() {
	if b == nil {
		return
	}
	if b.src != nil {
		b.src.Release(b.reserved)
	}
	b.recycle()
	b.reserved, b.size = 0, 0
}
