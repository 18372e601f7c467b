package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/template/tarbomb"
	"github.com/evalbox/evalbox/pkg/client"
)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (ownership, xattrs in trusted.*, mknod, mounts)")
	}
}

// entry is one member of a test archive.
type entry struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	uid, gid int
	major    int64
	minor    int64
	pax      map[string]string
}

func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Devmajor: e.major, Devminor: e.minor, PAXRecords: e.pax, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// capSysAdmin is a security.capability value (VFS_CAP_REVISION_2) granting
// CAP_SYS_ADMIN, effective.
var capSysAdmin = string([]byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x00, 0x20, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})

func TestExtractLayer(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	archive := tarOf(t,
		entry{name: "./", typ: tar.TypeDir, mode: 0o755},
		entry{name: "./etc/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "./etc/a", body: "alpha", mode: 0o4750, uid: 12, gid: 34,
			pax: map[string]string{"SCHILY.xattr.user.k": "v", "SCHILY.xattr.trusted.overlay.redirect": "/x",
				"SCHILY.xattr.security.capability": capSysAdmin, "SCHILY.xattr.trusted.other": "x",
				"SCHILY.xattr.user.overlay.redirect": "/x"}},
		entry{name: "./etc/g", body: "g", mode: 0o2755, gid: 34},
		entry{name: "./srv/", typ: tar.TypeDir, mode: 0o2775, gid: 34},
		entry{name: "./etc/b", typ: tar.TypeLink, link: "./etc/a"},
		entry{name: "./etc/gone", typ: tar.TypeChar, mode: 0},
		entry{name: "./etc/sda", typ: tar.TypeBlock, major: 8},
		entry{name: "./etc/null", typ: tar.TypeChar, major: 1, minor: 3},
		entry{name: "./etc/l", typ: tar.TypeSymlink, link: "/etc/a", uid: 5, gid: 6},
		entry{name: "./etc/fifo", typ: tar.TypeFifo, mode: 0o600},
		entry{name: "./var/cache/", typ: tar.TypeDir, mode: 0o700, uid: 7,
			pax: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}},
		entry{name: "./var/cache/new", body: "n"},
	)
	if _, err := extractTar(bytes.NewReader(archive), dir, extractOptions{layer: true}); err != nil {
		t.Fatal(err)
	}
	a, err := lstat(filepath.Join(dir, "etc/a"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Mode&0o7777 != 0o750 || a.Uid != 12 || a.Gid != 34 || a.Nlink != 2 {
		t.Errorf("etc/a: mode %o uid %d gid %d nlink %d", a.Mode&0o7777, a.Uid, a.Gid, a.Nlink)
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(dir, "etc/a"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("user.k: %q %v", buf[:n], err)
	}
	for _, x := range []string{"trusted.overlay.redirect", "security.capability", "trusted.other", "user.overlay.redirect"} {
		if _, err := unix.Lgetxattr(filepath.Join(dir, "etc/a"), x, nil); err != unix.ENODATA {
			t.Errorf("%s was kept (err %v)", x, err)
		}
	}
	// Set-id bits: dropped from files, kept on directories.
	if st, err := lstat(filepath.Join(dir, "etc/g")); err != nil || st.Mode&0o7777 != 0o755 {
		t.Errorf("etc/g: mode %o, want 755 (%v)", st.Mode&0o7777, err)
	}
	if st, err := lstat(filepath.Join(dir, "srv")); err != nil || st.Mode&0o7777 != 0o2775 {
		t.Errorf("srv: mode %o, want 2775 (%v)", st.Mode&0o7777, err)
	}
	if st, err := lstat(filepath.Join(dir, "etc/gone")); err != nil || !isWhiteout(st) {
		t.Errorf("etc/gone is not a whiteout: %v", err)
	}
	for _, p := range []string{"etc/sda", "etc/null"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("device %s was created: %v", p, err)
		}
	}
	if l, err := lstat(filepath.Join(dir, "etc/l")); err != nil || l.Uid != 5 {
		t.Errorf("etc/l: %v", err)
	}
	if st, err := lstat(filepath.Join(dir, "etc/fifo")); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("etc/fifo: %v", err)
	}
	if !isOpaque(filepath.Join(dir, "var/cache")) {
		t.Error("var/cache lost its opaque mark")
	}
	if st, _ := lstat(filepath.Join(dir, "var/cache")); st.Mode&0o777 != 0o700 || st.Uid != 7 {
		t.Errorf("var/cache: mode %o uid %d", st.Mode&0o777, st.Uid)
	}
	if st, _ := lstat(dir); st.Mode&0o777 != 0o755 {
		t.Errorf("root: mode %o, want the archive's 755", st.Mode&0o777)
	}
}

func TestExtractContextRefuses(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	cases := map[string][]byte{
		"dot-dot":  tarOf(t, entry{name: "a/../../x", body: "x"}),
		"absolute": tarOf(t, entry{name: "/tmp/x", body: "x"}),
		"device":   tarOf(t, entry{name: "null", typ: tar.TypeChar, major: 1, minor: 3}),
		// A symlink first, then a file "through" it: must not land outside.
		"through a symlink": tarOf(t, entry{name: "l", typ: tar.TypeSymlink, link: outside}, entry{name: "l/pwned", body: "x"}),
		"hard link out":     tarOf(t, entry{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}),
		"not a tar":         []byte(strings.Repeat("x", 1024)),
	}
	for name, archive := range cases {
		dir := t.TempDir()
		err := ExtractContext(bytes.NewReader(archive), dir, ContextLimits{})
		var ce *ContextError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a ContextError", name, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("a context wrote outside its directory: %v", entries)
	}
	// Ownership and set-id bits are not taken from the archive; the size is
	// bounded.
	dir := t.TempDir()
	if err := ExtractContext(bytes.NewReader(tarOf(t, entry{name: "f", body: "abc", uid: 1000, gid: 1000, mode: 0o6755})), dir, ContextLimits{}); err != nil {
		t.Fatal(err)
	}
	if st, _ := lstat(filepath.Join(dir, "f")); st.Uid != 0 || st.Gid != 0 || st.Mode&0o7777 != 0o755 {
		t.Errorf("context file owned by %d:%d, mode %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	err := ExtractContext(bytes.NewReader(tarOf(t, entry{name: "big", body: strings.Repeat("x", 100)})), t.TempDir(), ContextLimits{MaxBytes: 10})
	var ce *ContextError
	if !errors.As(err, &ce) || !ce.TooLarge {
		t.Errorf("oversize context: %v", err)
	}
}

// TestArchiveBombs: a sparse member that claims gigabytes in a few KiB is
// refused before anything is written, whether a build context or a
// layer; so are archives past their bounds of members and of metadata.
func TestArchiveBombs(t *testing.T) {
	needRoot(t)
	for name, bomb := range map[string][]byte{
		"pax": tarbomb.SparsePAX("bomb", 2<<30),
		"gnu": tarbomb.SparseGNU("bomb", 2<<30),
	} {
		dir := t.TempDir()
		err := ExtractContext(bytes.NewReader(bomb), dir, ContextLimits{})
		var ce *ContextError
		if !errors.As(err, &ce) || !strings.Contains(ce.Msg, "sparse file") {
			t.Errorf("%s context: %v", name, err)
		}
		if err := ScanContext(bytes.NewReader(bomb), io.Discard, client.TemplateSpec{}, ContextLimits{}); !errors.As(err, &ce) || !strings.Contains(ce.Msg, "sparse file") {
			t.Errorf("%s context scan: %v", name, err)
		}
		if _, err := extractTar(bytes.NewReader(bomb), dir, extractOptions{layer: true}); err == nil || !strings.Contains(err.Error(), "sparse file") {
			t.Errorf("%s layer: %v", name, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s: written: %v", name, entries)
		}
	}
	var many []entry
	for i := range 20 {
		many = append(many, entry{name: fmt.Sprintf("d%d/", i), typ: tar.TypeDir, mode: 0o755})
	}
	archive := tarOf(t, many...)
	if _, err := extractTar(bytes.NewReader(archive), t.TempDir(), extractOptions{layer: true, maxEntries: 10}); !errors.Is(err, errTooLarge) {
		t.Errorf("entries: %v", err)
	}
	err := ExtractContext(bytes.NewReader(archive), t.TempDir(), ContextLimits{MaxEntries: 10})
	var ce *ContextError
	if !errors.As(err, &ce) || !ce.TooLarge || !strings.Contains(ce.Msg, "more than 10 members") {
		t.Errorf("context entries: %v", err)
	}
	deep := tarOf(t, entry{name: strings.Repeat("a/", 2000) + "f", body: "x"})
	old := maxMetaBytes
	maxMetaBytes = 64 << 10
	defer func() { maxMetaBytes = old }()
	if _, err := extractTar(bytes.NewReader(deep), t.TempDir(), extractOptions{layer: true}); !errors.Is(err, errTooLarge) {
		t.Errorf("deep: %v", err)
	}
	// A charge sees every file before it is written, and stops the rest.
	errQuota := errors.New("quota")
	var charged int64
	err = ExtractContext(bytes.NewReader(tarOf(t, entry{name: "a", body: "12345"}, entry{name: "b", body: "678"})), t.TempDir(),
		ContextLimits{Charge: func(n int64) error {
			if charged+n > 6 {
				return errQuota
			}
			charged += n
			return nil
		}})
	if !errors.Is(err, errQuota) || charged != 5 {
		t.Errorf("charge: %v, %d charged", err, charged)
	}
}

func TestScanContext(t *testing.T) {
	spec := func(srcs ...string) client.TemplateSpec {
		var s client.TemplateSpec
		for _, src := range srcs {
			s.Steps = append(s.Steps, client.TemplateStep{Copy: &client.CopyStep{Src: src, Dst: "/x"}})
		}
		return s
	}
	good := tarOf(t,
		entry{name: "data/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "data/a", body: "alpha"},
		entry{name: "data/l", typ: tar.TypeSymlink, link: "a"},
		entry{name: "implicit/dir/f", body: "x"},
		entry{name: "out", typ: tar.TypeSymlink, link: "../../etc/passwd"},
	)
	// The copy is the archive, byte for byte.
	var copied bytes.Buffer
	if err := ScanContext(bytes.NewReader(good), &copied, spec("data", "data/a", "implicit/dir", "."+"/implicit"), ContextLimits{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copied.Bytes(), good) {
		t.Errorf("copied %d bytes of %d", copied.Len(), len(good))
	}
	for _, tc := range []struct {
		name    string
		archive []byte
		spec    client.TemplateSpec
		lim     ContextLimits
		msg     string
	}{
		{"missing source", good, spec("nope"), ContextLimits{}, "step 1: copy nope: not found in the build context"},
		{"symlink out", good, spec("."), ContextLimits{}, "out is a symlink to ../../etc/passwd, outside the build context"},
		{"through a symlink", tarOf(t, entry{name: "l", typ: tar.TypeSymlink, link: "data"}, entry{name: "data/f", body: "x"}),
			spec("data", "l/f"), ContextLimits{}, "step 2: copy l/f: l is a symlink"},
		{"absolute symlink", tarOf(t, entry{name: "d/abs", typ: tar.TypeSymlink, link: "/etc/shadow"}), spec("d"), ContextLimits{},
			"d/abs is a symlink to the absolute path /etc/shadow"},
		{"source outside", good, spec("../x"), ContextLimits{}, "is outside the build context"},
		{"dot-dot member", tarOf(t, entry{name: "a/../../x", body: "x"}), spec(), ContextLimits{}, "leaves the archive's root"},
		{"device", tarOf(t, entry{name: "null", typ: tar.TypeChar, major: 1, minor: 3}), spec(), ContextLimits{}, "device files are not allowed"},
		{"not a tar", []byte(strings.Repeat("x", 1024)), spec(), ContextLimits{}, "not a valid tar archive"},
		{"too large", good, spec(), ContextLimits{MaxBytes: 3}, "over the maximum of 3 bytes"},
		{"too many", good, spec(), ContextLimits{MaxEntries: 2}, "more than 2 members"},
	} {
		err := ScanContext(bytes.NewReader(tc.archive), io.Discard, tc.spec, tc.lim)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.msg)
		}
	}
	// The writer's error is returned as it is.
	errFull := errors.New("full")
	if err := ScanContext(bytes.NewReader(good), failingWriter{errFull}, spec(), ContextLimits{}); !errors.Is(err, errFull) {
		t.Errorf("writer error: %v", err)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }
