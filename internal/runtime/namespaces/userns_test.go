package namespaces

import (
	"errors"
	"path/filepath"
	"testing"
)

// Two allocators on one lock file (two servers of a host) never hand out
// the same block; released blocks come back; an exhausted pool says so.
func TestIDBlocks(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "userns.lock")
	a, err := newIDBlocks(lock, DefaultIDBase, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	b, err := newIDBlocks(lock, DefaultIDBase, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	a0, err := a.acquire()
	if err != nil {
		t.Fatal(err)
	}
	b0, err := b.acquire()
	if err != nil {
		t.Fatal(err)
	}
	a1, err := a.acquire()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for _, blk := range []idBlock{a0, b0, a1} {
		if seen[blk.hostID] {
			t.Fatalf("block %d handed out twice: %+v %+v %+v", blk.hostID, a0, b0, a1)
		}
		seen[blk.hostID] = true
		if blk.hostID != DefaultIDBase+uint32(blk.index)*idBlockSize {
			t.Errorf("block %+v: host id does not match its index", blk)
		}
	}
	if _, err := b.acquire(); !errors.Is(err, errNoIDBlock) {
		t.Fatalf("fourth block of three: %v", err)
	}
	b.release(b0)
	b.release(b0) // twice is harmless
	got, err := a.acquire()
	if err != nil || got.hostID != b0.hostID {
		t.Fatalf("after b released %+v, a got %+v, %v", b0, got, err)
	}
	// A closed allocator (a server that died) frees its blocks.
	a.close()
	c, err := newIDBlocks(lock, DefaultIDBase, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for range 2 {
		if _, err := c.acquire(); err != nil {
			t.Fatalf("blocks of a closed allocator: %v", err)
		}
	}
	if _, err := newIDBlocks(lock, 1<<31-idBlockSize, 2); err == nil {
		t.Error("blocks above 2^31 accepted")
	}
}
