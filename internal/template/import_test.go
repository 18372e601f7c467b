package template

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestImageUserReadsSafely: the image's /etc/passwd is read inside its
// root, non-blocking, a regular file only, and bounded: a FIFO there (or a
// symlink to one, or to a host file) neither blocks the import nor is read.
func TestImageUserReadsSafely(t *testing.T) {
	host := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(host, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, mk := range map[string]func(p string) error{
		"a FIFO":                   func(p string) error { return syscall.Mkfifo(p, 0o644) },
		"a symlink to a host FIFO": func(p string) error { return os.Symlink(fifo, p) },
		"a symlink out of the root": func(p string) error {
			return os.Symlink(strings.Repeat("../", 8)+strings.TrimPrefix(host, "/"), p)
		},
		"a huge file": func(p string) error {
			if err := os.WriteFile(p, []byte(strings.Repeat("x", 2<<20)+"\nroot:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
				return err
			}
			return nil
		},
	} {
		rootfs := t.TempDir()
		if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := mk(filepath.Join(rootfs, "etc/passwd")); err != nil {
			t.Fatal(err)
		}
		done := make(chan string, 1)
		go func() { done <- imageUser(rootfs, "") }()
		select {
		case u := <-done:
			if u != "0" {
				t.Errorf("%s: user %q, want 0 (nothing read)", name, u)
			}
		case <-time.After(10 * time.Second):
			if f, err := os.OpenFile(filepath.Join(rootfs, "etc/passwd"), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			t.Fatalf("%s: imageUser blocked", name)
		}
	}
	// A plain passwd inside the root still works.
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
	if u := imageUser(rootfs, ""); u != "root" {
		t.Errorf("plain passwd: %q", u)
	}
}
