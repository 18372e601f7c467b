package namespaces

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/runtime"
)

// startSandboxFrom is startSandbox for a sandbox whose layer starts with
// the archive upperTar.
func startSandboxFrom(t testing.TB, r *Runtime, spec runtime.Spec, upperTar string) *agent {
	t.Helper()
	return startWith(t, r, spec, func(ctx context.Context) (runtime.Sandbox, error) {
		return r.StartWithUpper(ctx, spec, upperTar)
	})
}

// tarMembers lists an archive's members by name.
func tarMembers(t *testing.T, p string) map[string]*tar.Header {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]*tar.Header{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return m
		}
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		m[strings.TrimSuffix(hdr.Name, "/")] = hdr
	}
}

// TestUpperExportImport changes a sandbox's files in every way a layer
// records, exports its layer, and starts a second sandbox from it: the
// second sees the first's files, with their owners and modes, and none of
// what it removed. It also holds the overlay's userxattr mode: removing a
// template directory used to fail with EIO.
func TestUpperExportImport(t *testing.T) {
	r := newRuntime(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startSandbox(t, r, testSpec(t, "upper-src"))
	a.mustRun(strings.Join([]string{
		"set -e",
		"rm -rf /etc/apt",                         // a template directory
		"mkdir /etc/apt", "echo new > /etc/apt/x", // opaque: the template's files stay hidden
		"mv /etc/default /etc/default2", // a renamed template directory (copied up)
		"rm /etc/debian_version",        // a whiteout
		"echo hello > /root/f", "chown 1000:1001 /root/f", "chmod 4750 /root/f",
		"ln /root/f /root/hard",
		"ln -s /etc/shadow /root/l",
		"ln -s / /root/hostroot", // the host must not follow it
		"mkfifo /root/p",         // the export must not block on it
		"mkdir -p /deep/a/b", "echo d > /deep/a/b/c", "touch -d 2001-02-03T04:05:06Z /deep/a",
		"chmod 751 /", // the layer's top is the sandbox's /
	}, "; "))
	tarPath := filepath.Join(t.TempDir(), "upper.tar")
	if err := a.s.ExportUpper(ctx, tarPath); err != nil {
		t.Fatalf("ExportUpper: %v", err)
	}
	m := tarMembers(t, tarPath)
	for name, want := range map[string]byte{"etc/apt": tar.TypeDir, "etc/debian_version": tar.TypeChar,
		"root/l": tar.TypeSymlink, "root/hostroot": tar.TypeSymlink, "root/p": tar.TypeFifo, "root/hard": tar.TypeReg} {
		if hdr := m[name]; hdr == nil || hdr.Typeflag != want {
			t.Errorf("member %s: %+v, want type %q", name, hdr, want)
		}
	}
	if hdr := m["."]; hdr == nil || hdr.Typeflag != tar.TypeDir || hdr.Mode != 0o751 || hdr.Uid != 0 {
		t.Errorf("the archive's top: %+v, want the sandbox's / (a directory, mode 751, uid 0)", hdr)
	}
	if m["etc/apt"].PAXRecords[opaquePAX] != "y" {
		t.Errorf("etc/apt is not marked opaque: %v", m["etc/apt"].PAXRecords)
	}
	if hdr := m["root/f"]; hdr == nil || hdr.Uid != 1000 || hdr.Gid != 1001 || hdr.Mode != 0o4750 {
		t.Errorf("root/f: %+v, want uid 1000, gid 1001 (as the sandbox sees them), mode 4750", hdr)
	}
	for name := range m {
		if strings.HasPrefix(name, "root/hostroot/") || strings.HasPrefix(name, ".evalbox") {
			t.Errorf("member %s: the export followed a symlink or kept the agent's mount point", name)
		}
	}

	b := startSandboxFrom(t, r, testSpec(t, "upper-dst"), tarPath)
	out := b.mustRun(strings.Join([]string{
		"ls -A /etc/apt",
		"test ! -e /etc/default && echo default-gone",
		"test -d /etc/default2 && echo default2",
		"test ! -e /etc/debian_version && echo version-gone",
		"stat -c '%a %u %g' /root/f /root/hard",
		"cat /root/f",
		"readlink /root/l /root/hostroot",
		"test -p /root/p && echo fifo",
		"cat /deep/a/b/c",
		"date -u -r /deep/a +%Y",
		"rm -rf /etc/default2 /deep && echo removed",
		"stat -c '%a %u' /",
	}, "; "))
	want := "x\ndefault-gone\ndefault2\nversion-gone\n4750 1000 1001\n4750 1000 1001\nhello\n/etc/shadow\n/\nfifo\nd\n2001\nremoved\n751 0\n"
	if out != want {
		t.Errorf("the second sandbox sees:\n%s\nwant:\n%s", out, want)
	}
}

// TestUpperExportSparse: a sparse file larger than the sandbox's disk
// cannot blow up the host's disk through an export.
func TestUpperExportSparse(t *testing.T) {
	r := newRuntime(t, Config{})
	spec := testSpec(t, "upper-sparse")
	spec.DiskMB = 16
	a := startSandbox(t, r, spec)
	a.mustRun("truncate -s 100G /sparse")
	tarPath := filepath.Join(t.TempDir(), "upper.tar")
	err := a.s.ExportUpper(context.Background(), tarPath)
	if !errors.Is(err, runtime.ErrUpperTooLarge) {
		t.Fatalf("ExportUpper of a 100 GiB sparse file on a 16 MiB disk: %v, want ErrUpperTooLarge", err)
	}
	if _, err := os.Stat(tarPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed export left its file: %v", err)
	}
	a.mustRun("rm /sparse") // the sandbox was thawed
	// Nor can many empty files (each costs a header block): 40,000 of
	// them on a 16 MiB disk.
	a.mustRun("mkdir /many && cd /many && seq 40000 | xargs touch")
	if err := a.s.ExportUpper(context.Background(), tarPath); !errors.Is(err, runtime.ErrUpperTooLarge) {
		t.Fatalf("ExportUpper of 40,000 empty files on a 16 MiB disk: %v, want ErrUpperTooLarge", err)
	}
}

// TestUpperImportHostile starts sandboxes from archives no export writes:
// each start fails, and nothing is written outside the sandbox, even into
// a directory of the host that anyone may write.
func TestUpperImportHostile(t *testing.T) {
	r := newRuntime(t, Config{})
	open := t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	reg := func(name, body string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}
	}
	cases := []struct {
		name    string
		members []*tar.Header
	}{
		{"dotdot", []*tar.Header{reg("../../../../../.."+open+"/evil", "x")}},
		{"absolute", []*tar.Header{reg(open+"/evil", "x")}},
		{"through a symlink", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "a", Linkname: open, Mode: 0o777},
			reg("a/evil", "x")}},
		{"over a symlink", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "evil", Linkname: open + "/evil", Mode: 0o777},
			reg("evil", "x")}},
		{"a device", []*tar.Header{{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3, Mode: 0o666}}},
		{"a hard link", []*tar.Header{{Typeflag: tar.TypeLink, Name: "evil", Linkname: open + "/x"}}},
		{"a missing parent", []*tar.Header{reg("no/such/dir", "x")}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range c.members {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				if h.Size > 0 {
					tw.Write([]byte(strings.Repeat("x", int(h.Size))))
				}
			}
			tw.Close()
			p := filepath.Join(t.TempDir(), "upper.tar")
			if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			spec := testSpec(t, "upper-hostile-"+string(rune('a'+i)))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			sb, err := r.StartWithUpper(ctx, spec, p)
			if err == nil {
				sb.Destroy(ctx)
				t.Fatalf("a sandbox started from an archive with %s", c.name)
			}
			if !strings.Contains(err.Error(), "snapshot's") {
				t.Errorf("error %q does not say it is the snapshot's files", err)
			}
			if left := r.Leftovers(spec.ID); len(left) > 0 {
				t.Errorf("leftovers after a failed start: %q", left)
			}
			entries, _ := os.ReadDir(open)
			if len(entries) > 0 {
				t.Fatalf("the archive wrote %s into a host directory", entries[0].Name())
			}
		})
	}
}

func TestMemberName(t *testing.T) {
	for _, n := range []string{"a", "a/b", "a/b/", ".hidden", "a..b"} {
		if _, err := memberName(n); err != nil {
			t.Errorf("memberName(%q): %v", n, err)
		}
	}
	for _, n := range []string{"", "/", "/a", "..", "../a", "a/../b", "a//b", "./a", "a/."} {
		if _, err := memberName(n); err == nil {
			t.Errorf("memberName(%q) accepted", n)
		}
	}
}
