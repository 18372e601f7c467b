// Package tarbomb builds hostile tar archives for tests: sparse entries
// that claim gigabytes in a few KiB (Go's archive/tar writes no sparse
// files, so the blocks are made here), in both formats the reader expands.
package tarbomb

import (
	"bytes"
	"fmt"
	"strconv"
)

const block = 512

// header is a tar header block: ustar when gnu is false, else the GNU
// format of old sparse files. The checksum is filled in.
func header(name string, typ byte, size int64, gnu bool) []byte {
	b := make([]byte, block)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], fmt.Sprintf("%011o\x00", 1700000000))
	b[156] = typ
	if gnu {
		copy(b[257:265], "ustar  \x00")
	} else {
		copy(b[257:263], "ustar\x00")
		copy(b[263:265], "00")
	}
	return b
}

func checksum(b []byte) {
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

func pad(b []byte) []byte {
	if r := len(b) % block; r != 0 {
		b = append(b, make([]byte, block-r)...)
	}
	return b
}

// end is the end-of-archive marker.
func end() []byte { return make([]byte, 2*block) }

// paxRecord formats one PAX record ("len key=value\n", len counting
// itself).
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	for {
		s := strconv.Itoa(n) + " " + k + "=" + v + "\n"
		if len(s) == n {
			return s
		}
		n = len(s)
	}
}

// SparsePAX is an archive of one regular file name of size bytes in GNU's
// PAX sparse format 1.0: all holes but its last byte. It is about 3 KiB.
func SparsePAX(name string, size int64) []byte {
	var out bytes.Buffer
	pax := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", name) + paxRecord("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	h := header("PaxHeaders.0/"+name, 'x', int64(len(pax)), false)
	checksum(h)
	out.Write(h)
	out.Write(pad([]byte(pax)))
	// The data: the sparse map (one fragment of one byte at the end), then
	// that byte.
	data := pad([]byte(fmt.Sprintf("1\n%d\n1\n", size-1)))
	data = append(data, 'x')
	h = header("GNUSparseFile.0/"+name, '0', int64(len(data)), false)
	checksum(h)
	out.Write(h)
	out.Write(pad(data))
	out.Write(end())
	return out.Bytes()
}

// SparseGNU is the same file in the old GNU sparse format (type 'S').
func SparseGNU(name string, size int64) []byte {
	var out bytes.Buffer
	h := header(name, 'S', 1, true)
	copy(h[386:398], fmt.Sprintf("%011o\x00", size-1)) // first fragment: offset
	copy(h[398:410], fmt.Sprintf("%011o\x00", 1))      // and length
	copy(h[483:495], fmt.Sprintf("%011o\x00", size))   // real size
	checksum(h)
	out.Write(h)
	out.Write(pad([]byte{'x'}))
	out.Write(end())
	return out.Bytes()
}

// Members joins archives (each ending with its end-of-archive marker)
// into one archive.
func Members(archives ...[]byte) []byte {
	var out bytes.Buffer
	for _, a := range archives {
		out.Write(bytes.TrimSuffix(a, end()))
	}
	out.Write(end())
	return out.Bytes()
}
