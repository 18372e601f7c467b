package leaks

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/internal/instance"
)

// Server is one evalbox server on the host, as its leaks are looked for.
type Server struct {
	// DataDir is the server's data dir (absolute, as given to serve).
	DataDir string
	// PID is the server process; 0 when it is not running (its children
	// and the id blocks it holds are not looked at then).
	PID int
}

// The kinds of a Snapshot.
const (
	KindGVisorProcs     = "gvisor processes"     // in the gVisor cgroup parent, or runsc with the server's --root
	KindNamespacesProcs = "namespaces processes" // in the namespaces cgroup parent, or an init stage of the server
	KindChildren        = "server children"      // processes whose parent is the server (zombies included)
	KindMounts          = "mounts"               // under the data dir
	KindCgroups         = "cgroups"              // below the server's cgroup parents, every hierarchy
	KindLinks           = "links"                // host links whose alias names the instance
	KindIptables        = "iptables rules"       // evalbox's chains, the jumps to them, rules naming a sandbox link
	KindNetns           = "netns files"          // <data-dir>/runsc/netns
	KindState           = "state files"          // <data-dir>/sandboxes, runsc's root, images/tmp
	KindIDBlocks        = "userns id blocks"     // id-block locks the server holds
)

// Kinds lists the kinds of a Snapshot in the order they are reported.
var Kinds = []string{KindGVisorProcs, KindNamespacesProcs, KindChildren, KindMounts, KindCgroups,
	KindLinks, KindIptables, KindNetns, KindState, KindIDBlocks}

// idLockFile is the host-wide lock file of the namespaces runtime's id
// blocks (namespaces.DefaultIDLockFile; a test holds them equal).
const idLockFile = "/run/evalbox/userns.lock"

// Snapshot is what one server holds on the host, by kind: one readable
// item per thing (a process, a mount, a cgroup directory, a rule, …).
type Snapshot map[string][]string

// Snapshot reads what server s holds on the host. It runs iptables-save.
func (h *Host) Snapshot(ctx context.Context, s Server) Snapshot {
	inst := instance.ID(s.DataDir)
	gvParent := "/" + instance.GVisorCgroupParent(inst) + "/"
	nsParent := "/" + instance.NamespacesCgroupParent(inst) + "/"
	runscRoot := filepath.Join(s.DataDir, "runsc")
	snap := Snapshot{}
	add := func(kind, item string) { snap[kind] = append(snap[kind], item) }
	for _, kind := range Kinds {
		snap[kind] = []string{}
	}

	for _, p := range h.Procs {
		if p.PID == s.PID {
			continue
		}
		item := fmt.Sprintf("%d (%c): %s", p.PID, p.State, p.Argv)
		switch {
		case strings.Contains(p.Cgroup, gvParent) || isRunscOf(p.Argv, runscRoot):
			add(KindGVisorProcs, item)
		case strings.Contains(p.Cgroup, nsParent) || (s.PID != 0 && p.PPID == s.PID && strings.HasPrefix(p.Argv, "evalbox-namespaces-init")):
			add(KindNamespacesProcs, item)
		}
		if s.PID != 0 && p.PPID == s.PID {
			add(KindChildren, fmt.Sprintf("%d (%c): %s", p.PID, p.State, p.Argv))
		}
	}
	for _, line := range h.Mounts {
		pre, post, _ := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		root, mp := unescape(f[3]), unescape(f[4])
		if under(mp, s.DataDir) || under(root, s.DataDir) {
			fstype, _, _ := strings.Cut(post, " ")
			add(KindMounts, mp+" ("+fstype+", root "+root+")")
		}
	}
	for _, d := range h.Cgroups {
		if strings.Contains(d, gvParent) || strings.Contains(d, nsParent) {
			add(KindCgroups, d)
		}
	}
	alias := "evalbox:" + inst + ":"
	for _, l := range h.Links {
		if strings.HasPrefix(l.Alias, alias) {
			add(KindLinks, l.Name+" "+l.Alias)
		}
	}
	rules := iptablesRules(ctx)
	// The links are read after the rules: a sandbox's chains are made
	// after its link (and its alias) and removed before it, so a rule
	// whose link is absent now is stale, never one being made.
	for _, r := range othersRules(rules, readLinks(), inst) {
		add(KindIptables, r)
	}
	for _, name := range dirNames(filepath.Join(runscRoot, "netns")) {
		add(KindNetns, filepath.Join(runscRoot, "netns", name))
	}
	for _, dir := range []string{filepath.Join(s.DataDir, "sandboxes"), runscRoot, filepath.Join(s.DataDir, "images", "tmp")} {
		for _, name := range dirNames(dir) {
			if dir == runscRoot && name == "netns" {
				continue
			}
			add(KindState, filepath.Join(dir, name))
		}
	}
	if s.PID != 0 {
		for _, l := range idBlockLocks(s.PID) {
			add(KindIDBlocks, l)
		}
	}
	for _, items := range snap {
		slices.Sort(items)
	}
	return snap
}

// under reports whether path is dir or below it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// isRunscOf reports whether argv is a runsc process (CLI, sandbox, gofer)
// of the runsc root dir.
func isRunscOf(argv, root string) bool {
	exe, _, _ := strings.Cut(argv, " ")
	if !strings.Contains(filepath.Base(exe), "runsc") {
		return false
	}
	return strings.Contains(argv, "--root "+root+" ") || strings.Contains(argv, "--root="+root+" ") ||
		strings.HasSuffix(argv, "--root "+root) || strings.HasSuffix(argv, "--root="+root)
}

// iptablesRules lists the rules of evalbox's chains in the filter and nat
// tables, the jumps to them, and any other rule that names a sandbox link
// (evb<N>), as "table: rule".
func iptablesRules(ctx context.Context) []string {
	var out []string
	for _, table := range []string{"filter", "nat"} {
		b, err := exec.CommandContext(ctx, "iptables-save", "-t", table).Output()
		if err != nil {
			out = append(out, table+": iptables-save: "+err.Error())
			continue
		}
		for _, l := range lines(b) {
			if name, ok := strings.CutPrefix(l, ":"); ok && isSandboxChain(name) {
				// A rules sandbox's chain, even empty.
				out = append(out, table+": chain "+strings.Fields(name)[0])
				continue
			}
			if !strings.HasPrefix(l, "-A ") {
				continue
			}
			if strings.Contains(l, "EVALBOX") || NamesSandboxLink(l) {
				out = append(out, table+": "+l)
			}
		}
	}
	return out
}

// othersRules returns rules without those of one sandbox link that
// another instance holds: sandbox links (evb<N>) and their chains
// (EVALBOX-SB-<N>, EVALBOX-PX-<N>) are numbered host-wide, and other
// servers on the host make and remove theirs at any time. A rule of a link
// that is absent, or whose alias names inst, stays: it is this server's,
// or a stale one no live sandbox owns.
func othersRules(rules []string, links []Link, inst string) []string {
	owner := map[string]string{}
	for _, l := range links {
		owner[l.Name] = l.Alias
	}
	ours := "evalbox:" + inst + ":"
	out := rules[:0:0]
	for _, r := range rules {
		if n, ok := ruleLink(r); ok {
			if alias, live := owner["evb"+n]; live && !strings.HasPrefix(alias, ours) {
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// ruleLink returns the number of the one sandbox link a rule names (evb<N>)
// or whose chain it declares, fills or jumps to (EVALBOX-SB-<N>,
// EVALBOX-PX-<N>).
func ruleLink(rule string) (string, bool) {
	for _, p := range []string{"evb", "EVALBOX-SB-", "EVALBOX-PX-"} {
		for i := 0; ; {
			j := strings.Index(rule[i:], p)
			if j < 0 {
				break
			}
			i += j + len(p)
			k := i
			for k < len(rule) && rule[k] >= '0' && rule[k] <= '9' {
				k++
			}
			if k > i && (k == len(rule) || !isNameByte(rule[k])) {
				return rule[i:k], true
			}
		}
	}
	return "", false
}

// isNameByte reports whether b may continue a link or chain name.
func isNameByte(b byte) bool {
	return b == '-' || b == '_' || b == '.' || b >= '0' && b <= '9' || b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z'
}

// isSandboxChain reports whether an iptables-save chain line (without its
// ':') declares a chain of one rules sandbox (EVALBOX-PX-<n> in nat,
// EVALBOX-SB-<n> in filter).
func isSandboxChain(line string) bool {
	name, _, _ := strings.Cut(line, " ")
	for _, p := range []string{"EVALBOX-PX-", "EVALBOX-SB-"} {
		if n, ok := strings.CutPrefix(name, p); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}

// NamesSandboxLink reports whether an iptables rule names one sandbox's
// link (evb0, evb17, …) rather than all of them (evb+).
func NamesSandboxLink(rule string) bool {
	for i := 0; ; {
		j := strings.Index(rule[i:], "evb")
		if j < 0 {
			return false
		}
		i += j + 3
		if i < len(rule) && rule[i] >= '0' && rule[i] <= '9' {
			return true
		}
	}
}

func dirNames(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// idBlockLocks lists the id-block locks process pid holds: the lock lines
// of its open description of the id lock file (OFD locks belong to the
// open file, so /proc/locks has no pid for them; fdinfo shows them).
func idBlockLocks(pid int) []string {
	fdDir := "/proc/" + strconv.Itoa(pid) + "/fd"
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err != nil || target != idLockFile {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/fdinfo/" + fd.Name())
		if err != nil {
			continue
		}
		for _, l := range lines(b) {
			if rest, ok := strings.CutPrefix(l, "lock:"); ok {
				// "1: OFDLCK ADVISORY WRITE -1 00:1a:123 7 7": the range.
				f := strings.Fields(rest)
				if n := len(f); n >= 2 {
					out = append(out, "block "+f[n-2]+"-"+f[n-1])
				}
			}
		}
	}
	return out
}

// Diff lists how s differs from base, one readable line per item: what is
// left ("<kind>: left: <item>") and what went missing ("<kind>: gone:
// <item>"; e.g. an iptables rule removed). Items are compared as
// multisets: a rule added twice shows once per copy.
func (s Snapshot) Diff(base Snapshot) []string {
	var out []string
	for _, kind := range Kinds {
		left, gone := multisetDiff(s[kind], base[kind])
		for _, it := range left {
			out = append(out, kind+": left: "+it)
		}
		for _, it := range gone {
			out = append(out, kind+": gone: "+it)
		}
	}
	return out
}

func multisetDiff(now, base []string) (added, removed []string) {
	count := map[string]int{}
	for _, it := range base {
		count[it]++
	}
	for _, it := range now {
		if count[it] > 0 {
			count[it]--
			continue
		}
		added = append(added, it)
	}
	for _, it := range base {
		if count[it] > 0 {
			count[it]--
			removed = append(removed, it)
		}
	}
	return added, removed
}

// Counts sums s up, one "kind n" per kind, in report order.
func (s Snapshot) Counts() string {
	parts := make([]string, 0, len(Kinds))
	for _, kind := range Kinds {
		parts = append(parts, fmt.Sprintf("%s %d", kind, len(s[kind])))
	}
	return strings.Join(parts, ", ")
}

// Filter returns s with only the items keep accepts (e.g. those of no
// sandbox a check allows to run).
func (s Snapshot) Filter(keep func(item string) bool) Snapshot {
	out := Snapshot{}
	for kind, items := range s {
		out[kind] = []string{}
		for _, it := range items {
			if keep(it) {
				out[kind] = append(out[kind], it)
			}
		}
	}
	return out
}

// SandboxItems lists, "<kind>: <item>", what in s belongs to sandboxes,
// sandbox starts or builds rather than to the server itself, which keeps
// for its life only the host's evalbox chains (shared by every instance)
// and runsc's shared empty network namespace (<data-dir>/runsc/null-netns,
// a bind mount). A server with no sandbox live, starting or building must
// hold none of it.
func (s Snapshot) SandboxItems(dataDir string) []string {
	nullNetns := filepath.Join(dataDir, "runsc", "null-netns")
	var out []string
	for _, kind := range Kinds {
		for _, it := range s[kind] {
			switch kind {
			case KindIptables:
				if !NamesSandboxLink(it) && !strings.Contains(it, ": chain ") {
					continue
				}
			case KindMounts:
				if strings.HasPrefix(it, nullNetns+" ") {
					continue
				}
			case KindState:
				if it == nullNetns {
					continue
				}
			}
			out = append(out, kind+": "+it)
		}
	}
	return out
}
