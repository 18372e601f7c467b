package oci

import (
	"archive/tar"
	"context"
	"errors"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (ownership and device nodes)")
	}
}

// fixture is a two-layer image exercising whiteouts, links, ownership,
// modes, times, devices and xattrs (of which only user.* are kept).
func fixture(t testing.TB) v1.Image {
	t.Helper()
	l1 := layerOf(t,
		dir("etc"),
		file("etc/hello", "hello v1"),
		ent{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755}, // no bin/ entry: implicit parent
		ent{name: "home/u", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1001, mtime: time.Unix(1600000000, 0)},
		ent{name: "home/u/notes", body: "mine", mode: 0o600, uid: 1000, gid: 1001, mtime: time.Unix(1650000000, 0),
			xattrs: map[string]string{"user.note": "kept", "trusted.overlay.opaque": "y", "trusted.other": "x",
				"security.capability": capSysAdmin, "system.posix_acl_access": aclUserRWX, "user.overlay.redirect": "/x"}},
		ent{name: "bin/gid", body: "#!/bin/sh\n", mode: 0o2755, gid: 42},
		ent{name: "shared", typ: tar.TypeDir, mode: 0o2775, gid: 42},
		file("gone", "deleted by layer 2"),
		dir("wdir"), file("wdir/child", "x"),
		dir("data/old"), file("data/old/inner", "x"),
		dir("opq"), file("opq/lower1", "x"), dir("opq/sub"), file("opq/sub/lower2", "x"),
		dir("opq2"), file("opq2/lower", "x"),
		symlink("lnk", "etc/hello"),
		symlink("abs", "/etc/hello"),
		symlink("up", "../../../../etc/hello"),
		hardlink("hard", "etc/hello"),
		dir("usr/lib"), symlink("lib", "usr/lib"),
		ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		ent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o666, major: 8},
		ent{name: "dev/wh", typ: tar.TypeChar, mode: 0o666},
		ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		dir("srv/app"),
	)
	l2 := layerOf(t,
		whiteout(".", "gone"),
		whiteout(".", "wdir"),
		file("data/old", "now a file"),                                 // a directory replaced by a file
		dir("opq"), file("opq/.wh..wh..opq", ""), file("opq/new", "x"), // marker before the new entries
		file("opq2/sub/added", "x"), file("opq2/.wh..wh..opq", ""), // marker after them
		file("etc/hello", "hello v2"), // "hard" keeps v1
		hardlink("hard2", "bin/tool"), // to a lower layer's file
		file("lib/libx.so", "elf"),    // through the lib -> usr/lib symlink
		symlink("lnk2", "nowhere"),
	)
	return imageOf(t, "", l1, l2)
}

func checkFixture(t *testing.T, root string) {
	t.Helper()
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Error(err)
		}
		return string(b)
	}
	stat := func(p string) *unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, p), &st); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return &st
	}
	absent := func(p string) {
		t.Helper()
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s should not exist (err %v)", p, err)
		}
	}
	link := func(p, want string) {
		t.Helper()
		got, err := os.Readlink(filepath.Join(root, p))
		if err != nil || got != want {
			t.Errorf("readlink %s = %q, %v; want %q", p, got, err, want)
		}
	}

	if got := read("etc/hello"); got != "hello v2" {
		t.Errorf("etc/hello = %q", got)
	}
	if got := read("hard"); got != "hello v1" {
		t.Errorf("hard = %q, want the content it was linked to (hello v1)", got)
	}
	if stat("hard").Ino == stat("etc/hello").Ino {
		t.Error("hard still shares the replaced file's inode")
	}
	tool, hard2 := stat("bin/tool"), stat("hard2")
	if tool.Ino != hard2.Ino || tool.Nlink != 2 {
		t.Errorf("hard2 not a hardlink of bin/tool (ino %d/%d, nlink %d)", tool.Ino, hard2.Ino, tool.Nlink)
	}
	if tool.Mode&0o7777 != 0o755 {
		t.Errorf("bin/tool mode %o, want 755 (set-user-ID dropped)", tool.Mode&0o7777)
	}
	if st := stat("bin/gid"); st.Mode&0o7777 != 0o755 || st.Gid != 42 {
		t.Errorf("bin/gid mode %o gid %d, want 755 (set-group-ID dropped) and 42", st.Mode&0o7777, st.Gid)
	}
	if st := stat("shared"); st.Mode&0o7777 != 0o2775 {
		t.Errorf("shared/ mode %o, want 2775 (a directory's set-group-ID is kept)", st.Mode&0o7777)
	}
	if st := stat("bin"); st.Mode&0o7777 != 0o755 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("implicit bin/ mode %o", st.Mode)
	}
	home := stat("home/u")
	if home.Mode&0o7777 != 0o700 || home.Uid != 1000 || home.Gid != 1001 || home.Mtim.Sec != 1600000000 {
		t.Errorf("home/u: mode %o uid %d gid %d mtime %d", home.Mode&0o7777, home.Uid, home.Gid, home.Mtim.Sec)
	}
	notes := stat("home/u/notes")
	if notes.Mode&0o7777 != 0o600 || notes.Uid != 1000 || notes.Gid != 1001 || notes.Mtim.Sec != 1650000000 {
		t.Errorf("home/u/notes: mode %o uid %d gid %d mtime %d", notes.Mode&0o7777, notes.Uid, notes.Gid, notes.Mtim.Sec)
	}
	buf := make([]byte, 64)
	if n, err := unix.Lgetxattr(filepath.Join(root, "home/u/notes"), "user.note", buf); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("xattr user.note = %q, %v", buf[:n], err)
	}
	for _, x := range []string{"trusted.overlay.opaque", "trusted.other", "security.capability", "system.posix_acl_access", "user.overlay.redirect"} {
		if _, err := unix.Lgetxattr(filepath.Join(root, "home/u/notes"), x, buf); err != unix.ENODATA {
			t.Errorf("xattr %s restored (err %v)", x, err)
		}
	}
	if st := stat("etc"); st.Mtim.Sec != mtime.Unix() {
		t.Errorf("etc mtime %d, want %d (kept though layer 2 changed its content)", st.Mtim.Sec, mtime.Unix())
	}
	if st := stat("."); st.Mode&0o7777 != 0o755 {
		t.Errorf("root mode %o", st.Mode&0o7777)
	}

	absent("gone")
	absent("wdir")
	if got := read("data/old"); got != "now a file" {
		t.Errorf("data/old = %q", got)
	}
	read("opq/new")
	absent("opq/lower1")
	absent("opq/sub")
	read("opq2/sub/added")
	absent("opq2/lower")

	link("lnk", "etc/hello")
	link("abs", "/etc/hello")
	link("up", "../../../../etc/hello")
	link("lnk2", "nowhere")
	link("lib", "usr/lib")
	if got := read("usr/lib/libx.so"); got != "elf" {
		t.Errorf("usr/lib/libx.so = %q", got)
	}

	// Device nodes are dropped, a 0/0 one too (OCI whiteouts are files).
	absent("dev/null")
	absent("dev/sda")
	absent("dev/wh")
	if st := stat("run/fifo"); st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o777 != 0o600 {
		t.Errorf("run/fifo mode %o", st.Mode)
	}

	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
		} else if strings.HasPrefix(d.Name(), ".wh.") {
			t.Errorf("whiteout written: %s", p)
		}
		return nil
	})
}

// capSysAdmin is a security.capability value (VFS_CAP_REVISION_2) granting
// CAP_SYS_ADMIN, effective.
var capSysAdmin = string([]byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x00, 0x20, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})

// aclUserRWX is a system.posix_acl_access value: user::rwx, user 1234 rwx,
// group::r-x, mask::rwx, other::r-x.
var aclUserRWX = string([]byte{
	0x02, 0x00, 0x00, 0x00,
	0x01, 0x00, 0x07, 0x00, 0xff, 0xff, 0xff, 0xff,
	0x02, 0x00, 0x07, 0x00, 0xd2, 0x04, 0x00, 0x00,
	0x04, 0x00, 0x05, 0x00, 0xff, 0xff, 0xff, 0xff,
	0x10, 0x00, 0x07, 0x00, 0xff, 0xff, 0xff, 0xff,
	0x20, 0x00, 0x05, 0x00, 0xff, 0xff, 0xff, 0xff,
})

func checkConfig(t *testing.T, cfg Config) {
	t.Helper()
	want := Config{Env: testConfig.Env, Workdir: testConfig.WorkingDir, User: testConfig.User,
		Entrypoint: testConfig.Entrypoint, Cmd: testConfig.Cmd}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config = %+v, want %+v", cfg, want)
	}
}

func TestImport(t *testing.T) {
	requireRoot(t)
	img := fixture(t)
	archiveDigest := func(t *testing.T, path string) string {
		i, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return digestOf(t, i)
	}
	for _, tc := range []struct {
		format string
		write  func(t *testing.T, src string) (digest string)
	}{
		{"docker-archive", func(t *testing.T, src string) string {
			writeArchive(t, src, "example.com/fixture:1", img)
			if d := archiveDigest(t, src); d != digestOf(t, img) {
				t.Errorf("archive digest %s differs from the image's %s", d, digestOf(t, img))
			}
			return digestOf(t, img)
		}},
		{"docker-save", func(t *testing.T, src string) string {
			writeDockerSave(t, src, "example.com/fixture:1", img)
			return archiveDigest(t, src)
		}},
		{"oci-layout", func(t *testing.T, src string) string {
			writeLayout(t, src, "", img)
			return digestOf(t, img)
		}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "image")
			want := tc.write(t, src)
			dst := filepath.Join(t.TempDir(), "rootfs")
			cfg, digest, err := Import(context.Background(), src, "", dst)
			if err != nil {
				t.Fatal(err)
			}
			if digest != want || !strings.HasPrefix(digest, "sha256:") {
				t.Errorf("digest %s, want %s", digest, want)
			}
			checkConfig(t, cfg)
			checkFixture(t, dst)
			ents, _ := os.ReadDir(filepath.Dir(dst))
			if len(ents) != 1 {
				t.Errorf("staging left next to dst: %v", ents)
			}
		})
	}
}

func TestImportRefs(t *testing.T) {
	one := imageOf(t, "", layerOf(t, file("which", "one")))
	two := imageOf(t, "", layerOf(t, file("which", "two")))
	srcDir := t.TempDir()

	lay := filepath.Join(srcDir, "layout")
	p := writeLayout(t, lay, "one", one)
	if err := p.AppendImage(two, layout.WithAnnotations(map[string]string{annotationRefName: "two"})); err != nil {
		t.Fatal(err)
	}
	arch := filepath.Join(srcDir, "multi.tar")
	if err := tarball.MultiRefWriteToFile(arch, map[name.Reference]v1.Image{
		name.MustParseReference("example.com/img:one"): one,
		name.MustParseReference("example.com/img:two"): two,
	}); err != nil {
		t.Fatal(err)
	}

	for _, src := range []struct{ path, two string }{{lay, "two"}, {arch, "example.com/img:two"}} {
		dstParent := t.TempDir()
		dst := filepath.Join(dstParent, "rootfs")
		_, digest, err := Import(context.Background(), src.path, src.two, dst)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "which")); string(b) != "two" || digest != digestOf(t, two) {
			t.Errorf("%s ref %s: got %q, digest %s", src.path, src.two, b, digest)
		}
		os.RemoveAll(dst)

		for _, ref := range []string{"", "three"} {
			_, _, err := Import(context.Background(), src.path, ref, dst)
			if !errors.Is(err, ErrUnknownRef) {
				t.Errorf("%s ref %q: err %v, want ErrUnknownRef", src.path, ref, err)
			} else {
				t.Logf("%s ref %q: %v", filepath.Base(src.path), ref, err)
			}
			assertNothingLeft(t, dstParent)
		}
	}

	// A layout's manifest can also be chosen by digest.
	dst := filepath.Join(t.TempDir(), "rootfs")
	if _, _, err := Import(context.Background(), lay, digestOf(t, one), dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "which")); string(b) != "one" {
		t.Errorf("by digest: %q", b)
	}
}

func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
}

func TestImportPlatformIndex(t *testing.T) {
	host := imageOf(t, "", layerOf(t, file("arch", runtime.GOARCH)))
	other := imageOf(t, otherArch(), layerOf(t, file("arch", otherArch())))
	addendum := func(img v1.Image, arch string) mutate.IndexAddendum {
		return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}}
	}
	both := mutate.AppendManifests(empty.Index, addendum(other, otherArch()), addendum(host, runtime.GOARCH))
	onlyOther := mutate.AppendManifests(empty.Index, addendum(other, otherArch()))

	src := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(src, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for ref, idx := range map[string]v1.ImageIndex{"multi": both, "foreign": onlyOther} {
		if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: ref})); err != nil {
			t.Fatal(err)
		}
	}
	dstParent := t.TempDir()
	dst := filepath.Join(dstParent, "rootfs")
	_, digest, err := Import(context.Background(), src, "multi", dst)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "arch")); string(b) != runtime.GOARCH || digest != digestOf(t, host) {
		t.Errorf("chose %q (digest %s), want the %s image %s", b, digest, runtime.GOARCH, digestOf(t, host))
	}
	os.RemoveAll(dst)

	_, _, err = Import(context.Background(), src, "foreign", dst)
	if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "no linux/"+runtime.GOARCH+" image") {
		t.Errorf("foreign-only index: %v", err)
	}
	assertNothingLeft(t, dstParent)

	// A lone image manifest for another architecture is refused too.
	src2 := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, src2, "", other)
	if _, _, err := Import(context.Background(), src2, "", dst); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "this host runs") {
		t.Errorf("foreign image: %v", err)
	}
	assertNothingLeft(t, dstParent)
}

func TestImportRemote(t *testing.T) {
	requireRoot(t)
	srv := httptest.NewServer(registry.New(registry.Logger(discardLog())))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	img := fixture(t)
	ref, err := name.ParseReference(host + "/evalbox/fixture:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	dstParent := t.TempDir()
	dst := filepath.Join(dstParent, "rootfs")
	// A registry on loopback: only when the operator allows it.
	im := &Importer{AllowRegistries: AllowList{host}}
	cfg, digest, err := im.ImportRemote(context.Background(), ref.String(), dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	if digest != digestOf(t, img) {
		t.Errorf("digest %s, want %s", digest, digestOf(t, img))
	}
	checkConfig(t, cfg)
	checkFixture(t, dst)

	_, _, err = im.ImportRemote(context.Background(), host+"/evalbox/fixture:nope", filepath.Join(dstParent, "other"), nil)
	if !errors.Is(err, ErrUnknownRef) {
		t.Errorf("unknown tag: %v", err)
	}
	if ents, _ := os.ReadDir(dstParent); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
}

func TestImportDestination(t *testing.T) {
	src := filepath.Join(t.TempDir(), "img.tar")
	writeArchive(t, src, "example.com/x:1", imageOf(t, "", layerOf(t, file("f", "x"))))

	dst := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "mine"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Import(context.Background(), src, "", dst); !errors.Is(err, fs.ErrExist) {
		t.Errorf("existing dst: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "mine")); string(b) != "keep" {
		t.Error("existing dst touched")
	}

	if _, _, err := Import(context.Background(), src, "", filepath.Join(t.TempDir(), "no", "parent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing parent: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dstParent := t.TempDir()
	if _, _, err := Import(ctx, src, "", filepath.Join(dstParent, "rootfs")); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	assertNothingLeft(t, dstParent)
}
