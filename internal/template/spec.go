package template

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/evalbox/evalbox/pkg/client"
)

// Step kinds of a build spec.
const (
	StepRun     = "run"
	StepCopy    = "copy"
	StepEnv     = "env"
	StepWorkdir = "workdir"
	StepUser    = "user"
)

var stepKinds = []string{StepRun, StepCopy, StepEnv, StepWorkdir, StepUser}

var specFields = []string{"from", "steps", "cpu", "memory_mb", "disk_mb", "start_cmd", "ready_cmd", "network"}

// Limits of a build spec.
const (
	MaxSteps    = 100
	maxRunBytes = 64 << 10
	maxEnvVars  = 256
)

// SpecError is a build spec that cannot be built; its message names the
// field or step at fault.
type SpecError struct{ Msg string }

func (e *SpecError) Error() string { return e.Msg }

func specErrorf(format string, a ...any) error { return &SpecError{Msg: fmt.Sprintf(format, a...)} }

// ParseSpec reads a build spec written in YAML or JSON (JSON is YAML) and
// checks it with ValidateSpec. Its errors are *SpecError, naming the
// field or step (1-based) at fault.
func ParseSpec(b []byte) (client.TemplateSpec, error) {
	var spec client.TemplateSpec
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return spec, specErrorf("spec is not valid YAML or JSON: %v", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return spec, specErrorf("spec is empty")
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return spec, specErrorf("spec must be a mapping (from, steps, …)")
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i].Value, top.Content[i+1]
		var err error
		switch k {
		case "from":
			spec.From, err = scalarString(v, "from")
		case "start_cmd":
			spec.StartCmd, err = scalarString(v, "start_cmd")
		case "ready_cmd":
			spec.ReadyCmd, err = scalarString(v, "ready_cmd")
		case "network":
			spec.Network, err = scalarString(v, "network")
		case "cpu":
			spec.CPU, err = scalarFloat(v, "cpu")
		case "memory_mb":
			spec.MemoryMB, err = scalarInt(v, "memory_mb")
		case "disk_mb":
			spec.DiskMB, err = scalarInt(v, "disk_mb")
		case "steps":
			spec.Steps, err = parseSteps(v)
		default:
			err = specErrorf("line %d: unknown field %q (want one of %s)", top.Content[i].Line, k, strings.Join(specFields, ", "))
		}
		if err != nil {
			return spec, err
		}
	}
	if err := ValidateSpec(spec); err != nil {
		return spec, err
	}
	return spec, nil
}

func scalarString(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", specErrorf("line %d: %s must be a string", n.Line, what)
	}
	return n.Value, nil
}

func scalarFloat(n *yaml.Node, what string) (float64, error) {
	if n.Kind == yaml.ScalarNode {
		if f, err := strconv.ParseFloat(n.Value, 64); err == nil {
			return f, nil
		}
	}
	return 0, specErrorf("line %d: %s must be a number", n.Line, what)
}

func scalarInt(n *yaml.Node, what string) (int, error) {
	if n.Kind == yaml.ScalarNode {
		if i, err := strconv.Atoi(n.Value); err == nil {
			return i, nil
		}
	}
	return 0, specErrorf("line %d: %s must be an integer", n.Line, what)
}

func parseSteps(n *yaml.Node) ([]client.TemplateStep, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, specErrorf("line %d: steps must be a list", n.Line)
	}
	steps := make([]client.TemplateStep, 0, len(n.Content))
	for i, sn := range n.Content {
		where := fmt.Sprintf("step %d (line %d)", i+1, sn.Line)
		if sn.Kind != yaml.MappingNode || len(sn.Content) != 2 {
			return nil, specErrorf("%s: a step is a mapping with exactly one key, its kind (one of %s)", where, strings.Join(stepKinds, ", "))
		}
		kind, v := sn.Content[0].Value, sn.Content[1]
		var st client.TemplateStep
		var err error
		switch kind {
		case StepRun:
			st.Run, err = scalarString(v, where+": run")
		case StepWorkdir:
			st.Workdir, err = scalarString(v, where+": workdir")
		case StepUser:
			st.User, err = scalarString(v, where+": user")
		case StepEnv:
			if v.Kind != yaml.MappingNode {
				return nil, specErrorf("%s: env must be a mapping of NAME: value", where)
			}
			st.Env = make(map[string]string, len(v.Content)/2)
			for j := 0; j+1 < len(v.Content); j += 2 {
				val := v.Content[j+1]
				if val.Kind != yaml.ScalarNode {
					return nil, specErrorf("%s: env %s must be a string", where, v.Content[j].Value)
				}
				st.Env[v.Content[j].Value] = val.Value
			}
		case StepCopy:
			st.Copy = &client.CopyStep{}
			switch v.Kind {
			case yaml.MappingNode:
				for j := 0; j+1 < len(v.Content); j += 2 {
					switch key := v.Content[j].Value; key {
					case "src":
						st.Copy.Src, err = scalarString(v.Content[j+1], where+": copy.src")
					case "dst":
						st.Copy.Dst, err = scalarString(v.Content[j+1], where+": copy.dst")
					case "owner":
						st.Copy.Owner, err = scalarString(v.Content[j+1], where+": copy.owner")
					case "mode":
						st.Copy.Mode, err = scalarString(v.Content[j+1], where+": copy.mode")
					default:
						err = specErrorf("%s: copy has src, dst, owner and mode, not %q", where, key)
					}
					if err != nil {
						return nil, err
					}
				}
			case yaml.ScalarNode:
				// copy: "SRC DST"
				f := strings.Fields(v.Value)
				if len(f) != 2 {
					return nil, specErrorf("%s: copy is {src: …, dst: …} or \"SRC DST\"", where)
				}
				st.Copy.Src, st.Copy.Dst = f[0], f[1]
			default:
				return nil, specErrorf("%s: copy is {src: …, dst: …} or \"SRC DST\"", where)
			}
		default:
			return nil, specErrorf("%s: unknown step kind %q (want one of %s)", where, kind, strings.Join(stepKinds, ", "))
		}
		if err != nil {
			return nil, err
		}
		// An empty value would read as no step at all.
		if (kind == StepRun && strings.TrimSpace(st.Run) == "") || (kind == StepWorkdir && st.Workdir == "") || (kind == StepUser && st.User == "") {
			return nil, specErrorf("step %d: %s: the value is empty", i+1, kind)
		}
		steps = append(steps, st)
	}
	return steps, nil
}

// StepKind returns the kind of a step, or "" if it sets no field or more
// than one.
func StepKind(st client.TemplateStep) string {
	kind, n := "", 0
	if st.Run != "" {
		kind, n = StepRun, n+1
	}
	if st.Copy != nil {
		kind, n = StepCopy, n+1
	}
	if st.Env != nil {
		kind, n = StepEnv, n+1
	}
	if st.Workdir != "" {
		kind, n = StepWorkdir, n+1
	}
	if st.User != "" {
		kind, n = StepUser, n+1
	}
	if n != 1 {
		return ""
	}
	return kind
}

var userRE = regexp.MustCompile(`^([a-z_][a-z0-9_.-]{0,31}\$?|[0-9]{1,10})$`)

// ValidateSpec checks a build spec on its own (the templates it names and
// the build context are checked by the build).
func ValidateSpec(spec client.TemplateSpec) error {
	if spec.From == "" {
		return specErrorf("from is required: the template to start from (e.g. base, python, node, or one of yours)")
	}
	if id, ok := SnapshotRef(spec.From); ok {
		if id == "" {
			return specErrorf("from: %q names no snapshot (snapshot:ID)", spec.From)
		}
	} else if name, tag := SplitRef(spec.From); !ValidName(name) || !ValidTag(tag) {
		return specErrorf("from: %q is not a template name (name or name:tag)", spec.From)
	}
	if len(spec.Steps) > MaxSteps {
		return specErrorf("steps: %d steps, at most %d", len(spec.Steps), MaxSteps)
	}
	if spec.CPU < 0 || spec.MemoryMB < 0 || spec.DiskMB < 0 {
		return specErrorf("cpu, memory_mb and disk_mb must not be negative")
	}
	switch spec.Network {
	case "", client.NetworkNone, client.NetworkOutbound:
	default:
		return specErrorf("network must be %q or %q, got %q", client.NetworkOutbound, client.NetworkNone, spec.Network)
	}
	if strings.ContainsRune(spec.ReadyCmd, 0) || len(spec.ReadyCmd) > maxRunBytes {
		return specErrorf("ready_cmd has a NUL byte or is over %d bytes", maxRunBytes)
	}
	if strings.ContainsRune(spec.StartCmd, 0) || len(spec.StartCmd) > maxRunBytes {
		return specErrorf("start_cmd has a NUL byte or is over %d bytes", maxRunBytes)
	}
	for i, st := range spec.Steps {
		if err := validateStep(st); err != nil {
			return specErrorf("step %d: %v", i+1, err)
		}
	}
	return nil
}

func validateStep(st client.TemplateStep) error {
	kind := StepKind(st)
	switch kind {
	case "":
		return fmt.Errorf("a step sets exactly one of %s", strings.Join(stepKinds, ", "))
	case StepRun:
		if strings.TrimSpace(st.Run) == "" || strings.ContainsRune(st.Run, 0) || len(st.Run) > maxRunBytes {
			return fmt.Errorf("run: the command is empty, has a NUL byte or is over %d bytes", maxRunBytes)
		}
	case StepEnv:
		if len(st.Env) == 0 || len(st.Env) > maxEnvVars {
			return fmt.Errorf("env: 1 to %d variables", maxEnvVars)
		}
		for k, v := range st.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || len(k) > 256 {
				return fmt.Errorf("env: %q is not a variable name", k)
			}
			if strings.ContainsRune(v, 0) || len(v) > 32<<10 {
				return fmt.Errorf("env %s: the value has a NUL byte or is over 32 KiB", k)
			}
		}
	case StepWorkdir:
		if !path.IsAbs(st.Workdir) || strings.ContainsRune(st.Workdir, 0) || len(st.Workdir) > 4096 {
			return fmt.Errorf("workdir %q must be an absolute path", st.Workdir)
		}
	case StepUser:
		if !userRE.MatchString(st.User) {
			return fmt.Errorf("user %q is not a user name or numeric uid", st.User)
		}
	case StepCopy:
		if _, err := contextPath(st.Copy.Src); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		if st.Copy.Dst == "" || strings.ContainsRune(st.Copy.Dst, 0) || len(st.Copy.Dst) > 4096 {
			return errors.New("copy: dst is required")
		}
		if st.Copy.Owner != "" {
			u, g, _ := strings.Cut(st.Copy.Owner, ":")
			if !userRE.MatchString(u) || (strings.Contains(st.Copy.Owner, ":") && !userRE.MatchString(g)) {
				return fmt.Errorf("copy: owner %q is not user or user:group (names or numeric ids)", st.Copy.Owner)
			}
		}
		if st.Copy.Mode != "" {
			if _, err := ParseMode(st.Copy.Mode); err != nil {
				return fmt.Errorf("copy: %w", err)
			}
		}
	}
	return nil
}

// ParseMode reads a copy step's mode: octal permission bits, "644" to
// "1777". Set-uid and set-gid bits are refused: no build plants a set-id
// program (tarx.go).
func ParseMode(m string) (fs.FileMode, error) {
	v, err := strconv.ParseUint(m, 8, 32)
	if err != nil || len(m) < 3 || len(m) > 5 || v > 0o7777 {
		return 0, fmt.Errorf("mode %q is not octal permission bits (e.g. 0644)", m)
	}
	if v&0o6000 != 0 {
		return 0, fmt.Errorf("mode %q sets set-uid or set-gid bits, which builds do not plant", m)
	}
	fm := fs.FileMode(v & 0o777)
	if v&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm, nil
}

// contextPath checks a copy source: a clean path relative to the build
// context's root that stays inside it ("." is the whole context).
func contextPath(src string) (string, error) {
	if src == "" {
		return "", errors.New("src is required")
	}
	if strings.ContainsRune(src, 0) {
		return "", fmt.Errorf("src %q has a NUL byte", src)
	}
	if path.IsAbs(src) {
		return "", fmt.Errorf("src %q is an absolute path; sources are relative to the build context", src)
	}
	c := path.Clean(src)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("src %q is outside the build context", src)
	}
	return c, nil
}

// CopySources lists the build context paths a spec's copy steps read
// (clean, relative, without duplicates): what a client must upload.
func CopySources(spec client.TemplateSpec) []string {
	var out []string
	for _, st := range spec.Steps {
		if st.Copy == nil {
			continue
		}
		if c, err := contextPath(st.Copy.Src); err == nil && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}
