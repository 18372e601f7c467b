package template

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// mkTree makes files in dir from a spec: "path" → content; a trailing "/"
// makes a directory, "->target" a symlink, "WHITEOUT" a whiteout,
// "OPAQUE/" an opaque directory.
func mkTree(t *testing.T, dir string, spec map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(spec))
	for k := range spec {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := spec[k]
		p := filepath.Join(dir, strings.TrimSuffix(k, "/"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case v == "WHITEOUT":
			err = unix.Mknod(p, unix.S_IFCHR, 0)
		case v == "OPAQUE/":
			if err = os.MkdirAll(p, 0o755); err == nil {
				err = unix.Lsetxattr(p, opaqueXattr, []byte("y"), 0)
			}
		case strings.HasSuffix(k, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(v, "->"):
			err = os.Symlink(strings.TrimPrefix(v, "->"), p)
		default:
			err = os.WriteFile(p, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// describe lists a tree: path, type, mode, owner, content or target.
func describe(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st, err := lstat(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %o %d:%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			c, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " %q", c)
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %s", l)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestFlattenMatchesOverlay compares flatten with the kernel's overlayfs
// over the same layers: the same tree, and hard links instead of copies.
func TestFlattenMatchesOverlay(t *testing.T) {
	needRoot(t)
	base, l1, l2 := t.TempDir(), t.TempDir(), t.TempDir()
	mkTree(t, base, map[string]string{
		"etc/passwd": "root", "etc/hostname": "h", "etc/keep": "k",
		"var/cache/a": "a", "var/cache/sub/b": "b", "usr/lib/x": "x", "lib": "->usr/lib",
		"opt/file-then-dir": "f", "srv/dir-then-file/inner": "i", "home/": "",
	})
	mkTree(t, l1, map[string]string{
		"etc/hostname": "WHITEOUT", "etc/new": "n1", "etc/passwd": "root+user",
		"var/cache": "OPAQUE/", "var/cache/fresh": "f1",
		"opt/file-then-dir/": "", "opt/file-then-dir/in": "d",
		"srv/dir-then-file": "now a file",
		"home/u/":           "",
	})
	mkTree(t, l2, map[string]string{
		"etc/new": "n2", "etc/keep": "WHITEOUT", "var/cache/later": "l2",
		"usr/lib/y": "y", "home/u/.profile": "p",
	})
	if err := os.Chmod(filepath.Join(l2, "home/u"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(l2, "home/u"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "rootfs")
	if err := flatten(dst, []string{l2, l1}, base); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := mountOverlay(mnt, []string{l2, l1, base}); err != nil {
		t.Fatal(err)
	}
	want := describe(t, mnt)
	if err := unmount(mnt); err != nil {
		t.Fatal(err)
	}
	// The roots differ (temp dirs); compare below them.
	got, want := dropFirstLine(describe(t, dst)), dropFirstLine(want)
	if got != want {
		t.Errorf("flatten:\n%s\noverlay:\n%s", got, want)
	}
	// Files are hard links into the layers (same filesystem).
	a, _ := lstat(filepath.Join(dst, "etc/new"))
	b, _ := lstat(filepath.Join(l2, "etc/new"))
	if a.Ino != b.Ino {
		t.Error("etc/new was copied, not linked")
	}
	if isOpaque(filepath.Join(dst, "var/cache")) {
		t.Error("the opaque marker was copied into the flattened tree")
	}
}

func dropFirstLine(s string) string {
	_, rest, _ := strings.Cut(s, "\n")
	return rest
}

func TestCopyLayer(t *testing.T) {
	needRoot(t)
	root, ctx := t.TempDir(), t.TempDir()
	mkTree(t, root, map[string]string{"usr/lib/": "", "lib": "->usr/lib", "app/": "", "etc/f": "file"})
	if err := os.Chown(filepath.Join(root, "app"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "app"), 0o750); err != nil {
		t.Fatal(err)
	}
	mkTree(t, ctx, map[string]string{"pkg/a.py": "a", "pkg/sub/b.py": "b", "pkg/link": "->a.py", "one.txt": "1"})
	if err := os.Chmod(filepath.Join(ctx, "pkg/a.py"), 0o755); err != nil {
		t.Fatal(err)
	}

	// A directory through a symlink of the root: lands in usr/lib.
	layer := t.TempDir()
	if err := buildCopyLayer(layer, root, ctx, "pkg", "/lib/pkg", "/", nil); err != nil {
		t.Fatal(err)
	}
	if got := dropFirstLine(describe(t, layer)); got != strings.Join([]string{
		"usr 40755 0:0", "usr/lib 40755 0:0", "usr/lib/pkg 40755 0:0",
		`usr/lib/pkg/a.py 100755 0:0 "a"`, "usr/lib/pkg/link 120777 0:0 -> a.py",
		"usr/lib/pkg/sub 40755 0:0", `usr/lib/pkg/sub/b.py 100644 0:0 "b"`, ""}, "\n") {
		t.Errorf("dir through a symlink:\n%s", got)
	}
	// A file into an existing directory (trailing / or not) keeps the
	// directory's metadata; a relative dst is relative to the workdir.
	for _, dst := range []string{"/app/", "/app", "."} {
		layer := t.TempDir()
		if err := buildCopyLayer(layer, root, ctx, "one.txt", dst, "/app", nil); err != nil {
			t.Fatal(err)
		}
		if got := dropFirstLine(describe(t, layer)); got != "app 40750 1000:1000\n"+`app/one.txt 100644 0:0 "1"`+"\n" {
			t.Errorf("file to %s:\n%s", dst, got)
		}
	}
	// A file to a new name; a directory onto a file is refused.
	layer = t.TempDir()
	if err := buildCopyLayer(layer, root, ctx, "one.txt", "/new/dir/renamed.txt", "/", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(layer, "new/dir/renamed.txt")); err != nil {
		t.Error(err)
	}
	if err := buildCopyLayer(t.TempDir(), root, ctx, "pkg", "/etc/f", "/", nil); err == nil {
		t.Error("copying a directory onto a file succeeded")
	}
}

// TestCopyLayerOwnerMode: a copy step's owner (names from the template's
// passwd and group, read inside it; numbers as they are) and mode go to
// what it copied, not to the directories it passed through, and never to
// the context's file (no hard link is shared).
func TestCopyLayerOwnerMode(t *testing.T) {
	needRoot(t)
	root, ctx, outside := t.TempDir(), t.TempDir(), t.TempDir()
	mkTree(t, root, map[string]string{"app/": "", "etc/group": "root:x:0:\nstaff:x:50:\napp:x:1001:\n"})
	// The template's passwd is a symlink: it is read inside the root,
	// never from the host.
	mkTree(t, outside, map[string]string{"passwd": "app:x:4242:4242::/:/bin/sh\n"})
	mkTree(t, root, map[string]string{"etc/passwd": "->/etc/passwd.real", "etc/passwd.real": "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"})
	mkTree(t, ctx, map[string]string{"pkg/a.py": "a", "pkg/sub/b.py": "b", "one.txt": "1"})

	layer := t.TempDir()
	if err := buildCopyLayer(layer, root, ctx, "pkg", "/app/pkg", "/", &copyAttrs{owner: "app", mode: "0640"}); err != nil {
		t.Fatal(err)
	}
	if got := dropFirstLine(describe(t, layer)); got != strings.Join([]string{
		"app 40755 0:0", "app/pkg 40640 1000:1001", `app/pkg/a.py 100640 1000:1001 "a"`,
		"app/pkg/sub 40640 1000:1001", `app/pkg/sub/b.py 100640 1000:1001 "b"`, ""}, "\n") {
		t.Errorf("a directory with owner app and mode 0640:\n%s", got)
	}
	if fi, err := os.Stat(filepath.Join(ctx, "pkg/a.py")); err != nil || fi.Mode().Perm() != 0o644 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the context's file changed: %v %v", fi.Mode(), err)
	}
	for owner, want := range map[string]string{"app:staff": "1000:50", "7:8": "7:8", "4321": "4321:4321", "root:app": "0:1001"} {
		layer := t.TempDir()
		if err := buildCopyLayer(layer, root, ctx, "one.txt", "/app/", "/", &copyAttrs{owner: owner}); err != nil {
			t.Fatalf("owner %s: %v", owner, err)
		}
		if got := dropFirstLine(describe(t, layer)); got != "app 40755 0:0\n"+`app/one.txt 100644 `+want+` "1"`+"\n" {
			t.Errorf("owner %s:\n%s", owner, got)
		}
	}
	for _, owner := range []string{"nobody", "app:nogroup"} {
		if err := buildCopyLayer(t.TempDir(), root, ctx, "one.txt", "/app/", "/", &copyAttrs{owner: owner}); err == nil {
			t.Errorf("owner %s, who is not in the template: no error", owner)
		}
	}
	// Set-id bits are never applied, whatever reaches the layer builder;
	// ids past 2^32-2 are refused.
	for _, a := range []*copyAttrs{{mode: "4755"}, {owner: "4294967295"}, {owner: "99999999999"}} {
		if err := buildCopyLayer(t.TempDir(), root, ctx, "one.txt", "/app/", "/", a); err == nil {
			t.Errorf("%+v: no error", *a)
		}
	}
	// A FIFO as the template's group file: refused at once, not waited on.
	if err := os.Remove(filepath.Join(root, "etc/group")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "etc/group"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- buildCopyLayer(t.TempDir(), root, ctx, "one.txt", "/app/", "/", &copyAttrs{owner: "app:staff"})
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("a FIFO group file: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a FIFO group file blocks the copy")
	}
}

func TestResolveIn(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	mkTree(t, root, map[string]string{"usr/lib/": "", "lib": "->usr/lib", "abs": "->/usr", "up": "->../../../usr", "loop": "->loop", "f": "x"})
	for p, want := range map[string]string{
		"/lib/x":      "/usr/lib/x",
		"/abs/lib/y":  "/usr/lib/y",
		"/up/lib":     "/usr/lib",
		"/new/a/b":    "/new/a/b",
		"/usr/../lib": "/usr/lib",
	} {
		if got, err := resolveIn(root, p); err != nil || got != want {
			t.Errorf("resolveIn(%s) = %q, %v; want %q", p, got, err, want)
		}
	}
	for _, p := range []string{"/loop/x", "/f/x"} {
		if got, err := resolveIn(root, p); err == nil {
			t.Errorf("resolveIn(%s) = %q, want an error", p, got)
		}
	}
}

func TestPrepareRootFSReplacesSymlinks(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	rootfs := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(rootfs, ".evalbox")); err != nil {
		t.Fatal(err)
	}
	if err := prepareRootFS(rootfs); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, ".evalbox/agent")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("agent mount point: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("prepareRootFS wrote through a symlink: %v", entries)
	}
}
