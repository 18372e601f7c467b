package tarbomb

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
)

func TestSparseArchivesClaimTheirSize(t *testing.T) {
	const size = 5 << 30
	for name, b := range map[string][]byte{"pax": SparsePAX("bomb", size), "gnu": SparseGNU("bomb", size)} {
		if len(b) > 4096 {
			t.Errorf("%s: %d bytes", name, len(b))
		}
		tr := tar.NewReader(bytes.NewReader(b))
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if hdr.Name != "bomb" || hdr.Size != size {
			t.Errorf("%s: %q of %d bytes", name, hdr.Name, hdr.Size)
		}
		// The start reads as zeros (a hole), without reading it all.
		head := make([]byte, 1<<20)
		if _, err := io.ReadFull(tr, head); err != nil || !bytes.Equal(head, make([]byte, len(head))) {
			t.Errorf("%s: head %v", name, err)
		}
		if _, err := tr.Next(); err != io.EOF {
			t.Errorf("%s: after the bomb: %v", name, err)
		}
	}
	if _, err := tar.NewReader(bytes.NewReader(Members(SparsePAX("a", 10), SparseGNU("b", 10)))).Next(); err != nil {
		t.Error(err)
	}
}
