// Package leaks finds what an evalbox server left on its host. It reads the
// host only (/proc, /sys, mountinfo, iptables-save) and knows evalbox's
// host-wide names (internal/instance), not its code, so that it judges the
// server from the outside:
//
//   - by sandbox id (Host.ByID): processes whose cgroup or command line
//     names the id, mounts naming it, cgroup directories named by it in
//     any hierarchy (v1 controllers and every cgroup2 mount), network links
//     whose name or alias names it, network namespace files, and the state
//     the data dir keeps for it (sandboxes/<id>, runsc's files of the id);
//   - for a whole server against a baseline (Host.Snapshot, Snapshot.Diff):
//     its sandboxes' processes per runtime, its direct children, mounts
//     under its data dir, the cgroups below its parents, its links, the
//     rules of evalbox's iptables chains, its netns and state files, and the
//     user-namespace id blocks it holds.
//
// The e2e suite (every sandbox it makes, every restart) and `evalbox bench
// soak` (after every cycle) use it.
package leaks

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Proc is a host process.
type Proc struct {
	PID, PPID int
	State     byte   // from /proc/<pid>/stat: R, S, Z, …
	Argv      string // the command line, arguments joined by spaces
	Cgroup    string // /proc/<pid>/cgroup
}

// Link is a host network interface.
type Link struct{ Name, Alias string }

// Host is one reading of the host state the checks look at. Reading it
// costs a pass over /proc and the cgroup trees (milliseconds); a check of
// many ids shares one reading.
type Host struct {
	Procs   []Proc
	Mounts  []string // lines of /proc/self/mountinfo
	Cgroups []string // cgroup directories, see maxCgroupDepth
	Links   []Link
}

// maxCgroupDepth bounds the walk of each cgroup hierarchy: a sandbox's
// cgroup is <parent>/<id> (depth 2; 3 and more when the server itself runs
// in a nested cgroup). Below a directory named evalbox-* the walk is
// complete (the namespaces runtime's per-command proc-* children).
const maxCgroupDepth = 4

// Scan reads the host.
func Scan() (*Host, error) {
	h := &Host{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("leaks: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			h.Procs = append(h.Procs, p)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("leaks: %w", err)
	}
	h.Mounts = strings.Split(strings.TrimSpace(string(mi)), "\n")
	for _, root := range cgroupMounts(h.Mounts) {
		h.Cgroups = append(h.Cgroups, walkCgroups(root, 0, false)...)
	}
	if _, err := os.Stat("/sys/class/net"); err != nil {
		return nil, fmt.Errorf("leaks: %w", err)
	}
	h.Links = readLinks()
	return h, nil
}

// readLinks lists the host's links with their aliases.
func readLinks() []Link {
	entries, _ := os.ReadDir("/sys/class/net")
	links := make([]Link, 0, len(entries))
	for _, l := range entries {
		alias, _ := os.ReadFile(filepath.Join("/sys/class/net", l.Name(), "ifalias"))
		links = append(links, Link{Name: l.Name(), Alias: strings.TrimSpace(string(alias))})
	}
	return links
}

// readProc reads what the checks need of one process; false when it
// exited meanwhile.
func readProc(pid int) (Proc, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return Proc{}, false
	}
	p := Proc{PID: pid}
	// pid (comm) state ppid …; comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i > 0 {
		f := strings.Fields(string(stat[i+1:]))
		if len(f) >= 2 {
			p.State = f[0][0]
			p.PPID, _ = strconv.Atoi(f[1])
		}
	}
	cmd, _ := os.ReadFile(dir + "/cmdline")
	p.Argv = strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
	cg, _ := os.ReadFile(dir + "/cgroup")
	p.Cgroup = string(cg)
	return p, true
}

// cgroupMounts returns the mount points of every cgroup (v1) and cgroup2
// filesystem in mountinfo.
func cgroupMounts(mounts []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, line := range mounts {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		fstype, _, _ := strings.Cut(post, " ")
		f := strings.Fields(pre)
		if (fstype != "cgroup" && fstype != "cgroup2") || len(f) < 5 {
			continue
		}
		if mp := unescape(f[4]); !seen[mp] {
			seen[mp] = true
			out = append(out, mp)
		}
	}
	return out
}

func walkCgroups(dir string, depth int, full bool) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		out = append(out, p)
		below := full || strings.HasPrefix(e.Name(), "evalbox-")
		if below || depth+1 < maxCgroupDepth {
			out = append(out, walkCgroups(p, depth+1, below)...)
		}
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for a space, …).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ByID lists, one readable line each, what the host still holds of
// sandbox id of the server on dataDir. Empty once the sandbox is gone.
func (h *Host) ByID(dataDir, id string) []string {
	var left []string
	for _, p := range h.Procs {
		if strings.Contains(p.Cgroup, id) || strings.Contains(p.Argv, id) {
			left = append(left, fmt.Sprintf("process %d (%c): %s", p.PID, p.State, p.Argv))
		}
	}
	for _, line := range h.Mounts {
		if strings.Contains(line, id) {
			left = append(left, "mount: "+line)
		}
	}
	for _, d := range h.Cgroups {
		if filepath.Base(d) == id {
			left = append(left, "cgroup: "+d)
		}
	}
	for _, pat := range []string{"/var/run/netns/*" + id + "*", "/run/netns/*" + id + "*",
		filepath.Join(dataDir, "sandboxes", id), filepath.Join(dataDir, "runsc", "*"+id+"*"),
		filepath.Join(dataDir, "runsc", "netns", id)} {
		m, _ := filepath.Glob(pat)
		for _, f := range m {
			left = append(left, "file: "+f)
		}
	}
	short := shortID(id)
	for _, l := range h.Links {
		// Outbound sandboxes' host links are named evb<N>, with the id in
		// their alias.
		if strings.Contains(l.Name, short) || strings.Contains(l.Alias, id) {
			left = append(left, "link: "+l.Name+" "+l.Alias)
		}
	}
	return left
}

// shortID is the part of an id used in names with length limits.
func shortID(id string) string {
	id = strings.TrimPrefix(id, "sb-")
	if len(id) > 8 {
		id = id[:8]
	}
	return id
}

// ByID reads the host and lists what it still holds of sandbox id of the
// server on dataDir.
func ByID(dataDir, id string) []string {
	h, err := Scan()
	if err != nil {
		return []string{err.Error()}
	}
	return h.ByID(dataDir, id)
}

// WaitGone reads the host until nothing of the ids is left or timeout
// passes, and returns what is left then, one line each (prefixed with the
// id). Destroy is synchronous, so the first reading normally finds
// nothing; the wait only tells a leak from a teardown still under way.
func WaitGone(ctx context.Context, dataDir string, ids []string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		h, err := Scan()
		if err != nil {
			left = []string{err.Error()}
		} else {
			for _, id := range ids {
				for _, l := range h.ByID(dataDir, id) {
					left = append(left, id+": "+l)
				}
			}
		}
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return left
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// lines returns the non-empty lines of b.
func lines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}
