package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// npmPinned is an npm package pinned to one version: name@version, the
// name possibly scoped. A built-in's digest names its npm packages, so a
// range (or a tag) would let two builds of one digest differ.
var npmPinned = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*@[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]*)?$`)

// installNpm installs pkgs into rootfs with the host's npm: globally under
// the rootfs's /usr/local, so that their commands are /usr/local/bin/NAME
// in a sandbox, with a throwaway cache under tmp, no install scripts run
// on the host, and no audit, funding or update check. The commands' links
// are checked to stay inside the rootfs (npm makes them relative).
func installNpm(ctx context.Context, rootfs, tmp string, pkgs []string, logw io.Writer) error {
	if len(pkgs) == 0 {
		return nil
	}
	npm, err := npmFor(pkgs)
	if err != nil {
		return err
	}
	prefix := filepath.Join(rootfs, "usr", "local")
	// The cache is beside the rootfs in the build's directory, which
	// becomes the template's: gone once the packages are in.
	cache := filepath.Join(tmp, "npm-cache")
	defer os.RemoveAll(cache)
	args := append([]string{"install", "--global", "--prefix", prefix, "--cache", cache,
		"--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=warn"}, pkgs...)
	cmd := exec.CommandContext(ctx, npm, args...)
	cmd.Stdout, cmd.Stderr = logw, logw
	cmd.Dir = tmp
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm install %s: %w", strings.Join(pkgs, " "), err)
	}
	return checkLinksInside(rootfs, filepath.Join(prefix, "bin"))
}

// npmFor checks that pkgs are pinned and returns the host's npm, which
// installs them (checked before a build starts, not after its packages).
func npmFor(pkgs []string) (string, error) {
	for _, p := range pkgs {
		if !npmPinned.MatchString(p) {
			return "", fmt.Errorf("npm package %q is not pinned to a version (name@x.y.z)", p)
		}
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("installing %s needs the host's npm (apt-get install npm): %w", strings.Join(pkgs, " "), err)
	}
	return npm, nil
}

// checkLinksInside makes every symlink in dir (a rootfs's directory of
// commands) resolve inside rootfs as the sandbox sees it: a relative
// target is kept, an absolute one under rootfs's host path is rewritten
// relative, any other absolute target (the host's) is an error.
func checkLinksInside(rootfs, dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		link := filepath.Join(dir, e.Name())
		target, err := os.Readlink(link)
		if err != nil {
			return err
		}
		if !filepath.IsAbs(target) {
			// Relative to dir inside the rootfs: it must not climb out.
			inside, err := filepath.Rel(rootfs, filepath.Join(dir, target))
			if err != nil || inside == ".." || strings.HasPrefix(inside, "../") {
				return fmt.Errorf("npm: %s links out of the rootfs (%s)", link, target)
			}
			continue
		}
		rel, err := filepath.Rel(rootfs, target)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Errorf("npm: %s links to the host's %s", link, target)
		}
		relTarget, err := filepath.Rel(dir, target)
		if err != nil {
			return err
		}
		if err := os.Remove(link); err != nil {
			return err
		}
		if err := os.Symlink(relTarget, link); err != nil {
			return err
		}
	}
	return nil
}
