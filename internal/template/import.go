package template

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ImageConfig is what an OCI image says about running it.
type ImageConfig struct {
	Env        []string // KEY=VALUE
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
}

// NewWorkDir makes a directory in the store's work area (removed by the
// caller, or at the next start).
func (r *Registry) NewWorkDir(prefix string) (string, error) {
	if err := r.needStore(); err != nil {
		return "", err
	}
	d, err := os.MkdirTemp(filepath.Join(r.store, tmpDir), prefix)
	if err != nil {
		return "", fmt.Errorf("template: %w", err)
	}
	return d, nil
}

// AddImport stores an imported image as a template: dir (in the store's
// work area) holds its root filesystem in dir/rootfs. Its defaults are the
// image's env, workdir and user over shape's cpu, memory and disk; its
// digest depends only on the image's manifest digest and those defaults,
// so importing the same image twice gives the same template. dir is
// consumed.
func (r *Registry) AddImport(dir, name, from, manifestDigest string, cfg ImageConfig, shape Defaults) (*Template, error) {
	rootfs := filepath.Join(dir, "rootfs")
	d := Defaults{CPU: shape.CPU, MemoryMB: shape.MemoryMB, DiskMB: shape.DiskMB, Env: map[string]string{},
		Workdir: cfg.Workdir, User: imageUser(rootfs, cfg.User)}
	for _, kv := range cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			d.Env[k] = v
		}
	}
	if _, ok := d.Env["PATH"]; !ok {
		d.Env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	if d.Workdir == "" {
		d.Workdir = "/"
	}
	digest := digestOf("import/v1", manifestDigest, d)
	if r.HasStored(digest) {
		if err := removeTree(dir); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
		return r.Get(digest)
	}
	if err := prepareRootFS(rootfs); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	size, err := DirSize(rootfs)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	own, err := r.storageBytes(rootfs)
	if err != nil {
		return nil, err
	}
	t := &Template{Name: name, Digest: digest, SizeBytes: size, StorageBytes: own, BuiltAt: time.Now().UTC(), Defaults: d,
		Source: SourceImport, From: strings.TrimSpace(from + " " + manifestDigest),
		Cmd: append(append([]string(nil), cfg.Entrypoint...), cfg.Cmd...)}
	if err := writeTemplateJSON(dir, t); err != nil {
		return nil, err
	}
	if err := r.commitStored(dir, digest); err != nil {
		return nil, err
	}
	return r.Get(digest)
}

// openInRoot opens the regular file name of the root filesystem rootfs:
// its symlinks resolve inside rootfs, never on the host; it does not block
// (a FIFO there is refused, not waited on).
func openInRoot(rootfs, name string) (*os.File, error) {
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("/%s is not a regular file", name)
	}
	return f, nil
}

// imageUser maps an image's User ("", "name", "uid", "name:group",
// "uid:gid") onto what the agent takes: a name or uid. Without a user the
// image runs as root: "root" when /etc/passwd knows it, else uid 0.
func imageUser(rootfs, u string) string {
	u, _, _ = strings.Cut(u, ":")
	if u != "" {
		return u
	}
	f, err := openInRoot(rootfs, "etc/passwd")
	if err != nil {
		return "0"
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "root:") {
			return "root"
		}
	}
	return "0"
}
