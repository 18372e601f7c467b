// Command seccompgen prepares a runsc build whose seccomp-bpf filters (those
// of the Sentry and of the gofer) are precompiled, the way gVisor's own
// Bazel build makes them. The gVisor module's Go branch, which go.mod pins,
// registers no precompiled program, so every `runsc boot` and `runsc gofer`
// compiles and optimises its filter at start: about a fifth of the CPU of a
// sandbox start (see BENCHMARKS.md).
//
// Run from the repository root:
//
//	go run ./internal/runtime/gvisor/seccompgen -out /tmp/runsc-src
//	CGO_ENABLED=0 go build -trimpath -modfile /tmp/runsc-src/go.mod -o bin/runsc gvisor.dev/gvisor/runsc
//
// -out receives a copy of the pinned gvisor.dev/gvisor module in which the
// two packages' filter_precompiled.go register the programs, and a go.mod
// (with its go.sum) that is the repository's plus a replace directive
// pointing at that copy: every other module resolves exactly as in the
// repository's own build. (go build -overlay cannot be used: Go refuses
// overlays of files in the module cache.)
//
// The programs are built by gVisor's own code (its PrecompiledPrograms) from
// its own rules, so runsc applies the very filters it would compile at
// start; a configuration with no precompiled program still compiles its own
// at start.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	bootconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

const gvisorModule = "gvisor.dev/gvisor"

// target is one package whose filter_precompiled.go is replaced.
type target struct {
	pkg      string // path inside the module
	name     string // package name
	programs func() ([]precompiledseccomp.Program, error)
	// keep selects the programs to embed by name (gVisor's ConfigKey).
	keep func(name string) bool
}

func targets(platform string) []target {
	return []target{
		{"runsc/boot/filter", "filter", bootconfig.PrecompiledPrograms, func(name string) bool {
			// gVisor precompiles every platform × network × directfs ×
			// device-proxy variant (576 programs, 18 MB of source); evalbox
			// runs one platform and no device proxies.
			return strings.Contains(name, fmt.Sprintf("Platform=%q", platform)) &&
				strings.Contains(name, "NVProxy=false") && strings.Contains(name, "TPUProxy=false") &&
				strings.Contains(name, "RDMAProxy=false")
		}},
		{"runsc/fsgofer/filter", "filter", goferconfig.PrecompiledPrograms, func(string) bool { return true }},
	}
}

func main() {
	out := flag.String("out", "", "directory to write the module copy, go.mod and go.sum into (replaced)")
	platform := flag.String("platform", "systrap", "the runsc platform whose Sentry filters to embed")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "seccompgen: -out is required")
		os.Exit(2)
	}
	if err := run(*out, targets(*platform)); err != nil {
		fmt.Fprintln(os.Stderr, "seccompgen:", err)
		os.Exit(1)
	}
}

func run(out string, targets []target) error {
	out, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	var mod struct{ Dir, Version, GoMod string }
	b, err := exec.Command("go", "list", "-m", "-json", gvisorModule).Output()
	if err != nil {
		return fmt.Errorf("go list -m %s: %w", gvisorModule, err)
	}
	if err := json.Unmarshal(b, &mod); err != nil {
		return err
	}
	if mod.Dir == "" {
		return fmt.Errorf("%s is not in the module cache (go mod download %s)", gvisorModule, gvisorModule)
	}
	main, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	mainMod := strings.TrimSpace(string(main))
	if mainMod == "" || mainMod == os.DevNull {
		return errors.New("run from inside the repository (no go.mod found)")
	}

	if err := os.RemoveAll(out); err != nil {
		return err
	}
	src := filepath.Join(out, "gvisor")
	if err := copyTree(mod.Dir, src); err != nil {
		return fmt.Errorf("copy %s: %w", gvisorModule, err)
	}
	for _, t := range targets {
		all, err := t.programs()
		if err != nil {
			return fmt.Errorf("%s: %w", t.pkg, err)
		}
		var programs []precompiledseccomp.Program
		for _, p := range all {
			if t.keep(p.Name) {
				programs = append(programs, p)
			}
		}
		if len(programs) == 0 {
			return fmt.Errorf("%s: no program left to embed", t.pkg)
		}
		dst := filepath.Join(src, t.pkg, "filter_precompiled.go")
		if _, err := os.Stat(dst); err != nil {
			return fmt.Errorf("%s has no filter_precompiled.go to replace: %w", t.pkg, err)
		}
		if err := os.WriteFile(dst, source(t.name, mod.Version, programs), 0o644); err != nil {
			return err
		}
	}
	gomod, err := os.ReadFile(mainMod)
	if err != nil {
		return err
	}
	gomod = fmt.Appendf(bytes.Clone(gomod), "\nreplace %s %s => %s\n", gvisorModule, mod.Version, src)
	if err := os.WriteFile(filepath.Join(out, "go.mod"), gomod, 0o644); err != nil {
		return err
	}
	sum, err := os.ReadFile(strings.TrimSuffix(mainMod, ".mod") + ".sum")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "go.sum"), sum, 0o644)
}

// source is the replacement filter_precompiled.go: the API of gVisor's
// template (GetPrecompiled, ListPrecompiled, PrecompilationDisabledAtBuildTime)
// with the programs registered.
func source(pkg, version string, programs []precompiledseccomp.Program) []byte {
	sort.Slice(programs, func(i, j int) bool { return programs[i].Name < programs[j].Name })
	var b strings.Builder
	fmt.Fprintf(&b, `// Code generated by evalbox's seccompgen from the filter rules of %s@%s; DO NOT EDIT.

package %s

import (
	"sort"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	"gvisor.dev/gvisor/pkg/sync"
)

var (
	precompiledPrograms             map[string]precompiledseccomp.Program
	registerPrecompiledProgramsOnce sync.Once
)

// PrecompilationDisabledAtBuildTime is false: the programs are precompiled.
const PrecompilationDisabledAtBuildTime = false

// GetPrecompiled returns the precompiled program for the given name,
// and whether that program name exists.
func GetPrecompiled(programName string) (precompiledseccomp.Program, bool) {
	registerPrecompiledProgramsOnce.Do(registerPrograms)
	program, ok := precompiledPrograms[programName]
	return program, ok
}

// ListPrecompiled returns a list of all registered program names.
func ListPrecompiled() []string {
	registerPrecompiledProgramsOnce.Do(registerPrograms)
	programNames := make([]string, 0, len(precompiledPrograms))
	for name := range precompiledPrograms {
		programNames = append(programNames, name)
	}
	sort.Strings(programNames)
	return programNames
}

func registerPrograms() {
	programs := make(map[string]precompiledseccomp.Program, %d)
`, gvisorModule, version, pkg, len(programs))
	for _, p := range programs {
		b.WriteString(p.Registration("\t", "precompiledseccomp", "programs"))
	}
	b.WriteString("\tprecompiledPrograms = programs\n}\n")
	return []byte(b.String())
}

// copyTree copies the regular files and directories of src to dst, made
// writable (the module cache is read-only).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			return copyFile(path, target)
		default:
			return nil
		}
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
