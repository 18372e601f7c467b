package cli

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteTar(t *testing.T) {
	dir := t.TempDir()
	for p, body := range map[string]string{"data/a.txt": "a", "data/sub/b.txt": "b", "other/skip.txt": "s", "one.txt": "1"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "data/link")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeTar(&buf, dir, []string{"data", "one.txt", "data/a.txt"}); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s: owner %d %q sent", h.Name, h.Uid, h.Uname)
		}
		if h.Name == "data/link" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/passwd") {
			t.Errorf("symlink sent as %+v (must not be followed)", h)
		}
		if h.Name == "data/a.txt" && h.Mode&0o777 != 0o640 {
			t.Errorf("mode %o", h.Mode)
		}
	}
	if got := strings.Join(names, " "); got != "data/ data/a.txt data/link data/sub/ data/sub/b.txt one.txt" {
		t.Errorf("sent %s", got)
	}
	// Sockets, devices and fifos are not sent.
	if err := syscall.Mkfifo(filepath.Join(dir, "data/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeTar(io.Discard, dir, []string{"data"}); err == nil || !strings.Contains(err.Error(), "only files, directories and symlinks") {
		t.Errorf("fifo: %v", err)
	}
}
