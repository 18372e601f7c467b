package template

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testMirror is the mirror the recorded digests were computed with.
const testMirror = "http://deb.debian.org/debian"

// TestBuiltinDigestsUnchanged: the built-ins that were there before the
// polyglot template keep the digests of their builds (recorded here), so
// that adding spec fields (Npm, EssentialHooks: omitted when empty) never
// rebuilds the templates every installation has cached. A change to one
// of these specs must change its constant here, on purpose.
func TestBuiltinDigestsUnchanged(t *testing.T) {
	for name, want := range map[string]string{
		"base":             "sha256:d066751af94f3765d62272ec6c9c69ee071f4fe64b8a9b355f4534a2aa881a62",
		"python":           "sha256:c00049d404750c1d0cbf19ecfe1280edf6b9b1cd174ebc22f1c1b63e48756599",
		"node":             "sha256:e7dd557172c0c485acd611b9e8c1a9ba83cb82431f54efada2db49e0d58cc730",
		"code-interpreter": "sha256:3c8a8a43d8feb880367c900925c482c59f91f5969218d6059c09ff6680d3b134",
	} {
		if got := Builtins[name].Digest(testMirror); got != want {
			t.Errorf("%s: digest %s, was %s", name, got, want)
		}
	}
}

// TestPolyglotSpec: the polyglot template has every toolchain, its npm
// packages pinned and in its digest, the manual's directories openjdk's
// postinst needs made by an essential hook only it has, and room for a JVM.
func TestPolyglotSpec(t *testing.T) {
	p := Builtins["polyglot"]
	for _, pkg := range []string{"gcc", "g++", "libc6-dev", "openjdk-17-jdk-headless", "nodejs", "golang-go", "rustc", "python3", "bash"} {
		if !slices.Contains(p.Packages, pkg) {
			t.Errorf("polyglot lacks %s", pkg)
		}
	}
	if !slices.Contains(p.Npm, "typescript@5.6.3") || p.Defaults.MemoryMB != 1024 || p.Defaults.Workdir != "/work" {
		t.Errorf("polyglot: %+v", p)
	}
	for name, s := range Builtins {
		for _, pkg := range s.Npm {
			if !npmPinned.MatchString(pkg) {
				t.Errorf("%s: npm package %q is not pinned", name, pkg)
			}
		}
		args := strings.Join(s.mmdebstrapArgs("/r", testMirror), " ")
		if hook := strings.Contains(args, "--essential-hook="); hook != (name == "polyglot") {
			t.Errorf("%s: mmdebstrap %s", name, args)
		}
	}
	if args := p.mmdebstrapArgs("/r", testMirror); !slices.Contains(args, `--essential-hook=mkdir -p "$1/usr/share/man/man1"`) ||
		!slices.Equal(args[len(args)-3:], []string{"bookworm", "/r", testMirror}) {
		t.Errorf("polyglot: mmdebstrap %q", args)
	}

	// The digest covers the npm packages (and the hooks).
	other := p
	other.Npm = []string{"typescript@5.6.2", "@types/node@18.19.130"}
	if other.Digest(testMirror) == p.Digest(testMirror) {
		t.Error("the npm packages are not in the digest")
	}
	other = p
	other.EssentialHooks = nil
	if other.Digest(testMirror) == p.Digest(testMirror) {
		t.Error("the essential hooks are not in the digest")
	}
	for _, bad := range []string{"typescript", "typescript@latest", "typescript@^5.6.3", "@types/node@18", "x@1.2.3 && rm -rf /"} {
		if _, err := npmFor([]string{bad}); err == nil || !strings.Contains(err.Error(), "not pinned") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestNpmLinksStayInside: the commands npm links into the rootfs's
// /usr/local/bin resolve inside it: relative links are kept, absolute
// ones into the rootfs made relative, and one to the host's files or
// climbing out refused.
func TestNpmLinksStayInside(t *testing.T) {
	rootfs := t.TempDir()
	bin := filepath.Join(rootfs, "usr", "local", "bin")
	lib := filepath.Join(rootfs, "usr", "local", "lib", "node_modules", "typescript", "bin")
	for _, d := range []string{bin, lib} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(name, target string) {
		t.Helper()
		_ = os.Remove(filepath.Join(bin, name))
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	link("tsc", "../lib/node_modules/typescript/bin/tsc")
	link("tsserver", filepath.Join(lib, "tsserver"))
	if err := checkLinksInside(rootfs, bin); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"tsc": "../lib/node_modules/typescript/bin/tsc", "tsserver": "../lib/node_modules/typescript/bin/tsserver"} {
		if got, _ := os.Readlink(filepath.Join(bin, name)); got != want {
			t.Errorf("%s -> %s, want %s", name, got, want)
		}
	}
	for _, bad := range []string{"/usr/lib/node_modules/typescript/bin/tsc", "../../../../etc/passwd"} {
		link("evil", bad)
		if err := checkLinksInside(rootfs, bin); err == nil {
			t.Errorf("a link to %s was accepted", bad)
		}
	}
}
