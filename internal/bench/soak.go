package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/internal/leaks"
	"github.com/evalbox/evalbox/pkg/client"
)

type soakOpts struct {
	runtimes     []string
	templatesDir string
	template     string
	n            int
	checkEvery   int
	concurrency  int
	warmup       int
	settle       time.Duration
	rssSlackMB   float64
	fdSlack      int
	json         bool
}

func soakCommand() *cobra.Command {
	var o soakOpts
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Create → exec → write → read → delete cycles on every runtime, checking the host for leaks after each",
		Long: `Starts evalbox serve (this binary) on a temporary data dir and runs --n cycles per
runtime through the REST API, one runtime after the other in turn, the network
mode alternating between none and outbound (veth, netns, iptables) on each:
create a sandbox, exec a command that also leaves a background daemon and a
file (so that teardown really has something to kill), write a file, read it
back (content checked), delete.

After every --check-every cycles (all in flight finished) it checks, for each
sandbox of the batch by its id: no host process whose cgroup or command line
names it, no mount, no cgroup directory in any hierarchy, no link, no netns or
state file, and its row is not running in the API; and for the whole server
against a baseline taken before the first cycle (after one cycle per runtime and
mode, which sets up what a server keeps for its life: the iptables chains,
runsc's shared empty network namespace): its sandbox processes per runtime and
its children, mounts under the data dir, cgroups below its parents, links,
the rules of evalbox's iptables chains, netns and state files, the user
namespace id blocks it holds, and the team's running sandboxes in the API. A
leftover must be gone within --settle.

Server growth: RSS and open fds of the server process, sampled at every check.
The minimum over the first window after --warmup cycles per runtime is compared
with the minimum over the last window (a window is a fifth of the samples after
warm-up): a Go process's RSS swings with its garbage collector, its minimum does
not. Growth beyond --rss-slack-mb or --fd-slack fails.

Prints a Markdown table (or --json) and exits 1 if anything leaked or grew,
printing each leak on a line of its own; the soak stops at the first check that
finds one. What the soak leaves is swept by a server restarted on its data dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSoak(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.runtimes, "runtimes", []string{client.RuntimeGVisor, client.RuntimeNamespaces}, "runtimes to soak")
	f.StringVar(&o.templatesDir, "templates-dir", "/var/lib/evalbox/templates", "template directory (built by evalbox template init)")
	f.StringVar(&o.template, "template", "base", "template of the sandboxes")
	f.IntVar(&o.n, "n", 1000, "cycles per runtime")
	f.IntVar(&o.checkEvery, "check-every", 1, "check the host after every this many cycles (all runtimes counted)")
	f.IntVar(&o.concurrency, "concurrency", 1, "cycles in flight at once (at most --check-every)")
	f.IntVar(&o.warmup, "warmup", 50, "cycles per runtime before the growth baseline")
	f.DurationVar(&o.settle, "settle", 5*time.Second, "how long a leftover may take to go before it is a leak")
	f.Float64Var(&o.rssSlackMB, "rss-slack-mb", 32, "server RSS growth (MiB, min of last window over min of first) that fails")
	f.IntVar(&o.fdSlack, "fd-slack", 8, "server open-fd growth that fails")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	return cmd
}

// Soak cycle phases, in order.
var soakPhases = []string{"create", "exec", "write", "read", "delete", "cycle"}

// soakCycle is one create → … → delete.
type soakCycle struct {
	runtime, network string
	seq              int // per runtime
	id               string
	d                map[string]time.Duration
	err              error
	retries          []string // creates answered 503 unavailable, tried again
}

// soakRuntime accumulates one runtime's cycles.
type soakRuntime struct {
	name     string
	cycles   int
	networks map[string]int
	phases   map[string]sample
	busy     time.Duration // sum of cycle times
	leaks    int           // found by the id of one of its sandboxes
	retries  []string      // creates tried again (their errors)
}

// serverSample is the server's RSS and open fds at a check.
type serverSample struct {
	cycles int // cycles done per runtime (the slowest runtime's count)
	rss    float64
	fds    float64
}

// soaker runs a soak against one server.
type soaker struct {
	o     soakOpts
	s     *server
	c     *client.Client // the soak team's
	srv   leaks.Server
	base  leaks.Snapshot
	stats map[string]*soakRuntime
	log   io.Writer
	// rewrites counts the checks that found the evalbox chains rewritten
	// by another process.
	rewrites int
}

func runSoak(ctx context.Context, stdout, stderr io.Writer, o soakOpts) error {
	if o.n < 1 || o.checkEvery < 1 || o.concurrency < 1 || len(o.runtimes) == 0 {
		return errors.New("soak: --n, --check-every and --concurrency must be at least 1, --runtimes not empty")
	}
	o.concurrency = min(o.concurrency, o.checkEvery)
	s, err := startServer(ctx, o.templatesDir, "--log-level", "warn")
	if err != nil {
		return err
	}
	k := &soaker{o: o, s: s, srv: leaks.Server{DataDir: s.dataDir, PID: s.cmd.Process.Pid},
		stats: map[string]*soakRuntime{}, log: stderr}
	rep, runErr := k.run(ctx)
	rep.ServerErrors = serverLogErrors(filepath.Join(s.dataDir, "serve.log"))
	shutLeft, cerr := k.cleanup(context.WithoutCancel(ctx), rep.Leaks)
	for _, l := range shutLeft {
		rep.Leaks = append(rep.Leaks, "after the server's shutdown: "+l)
	}
	if cerr != nil {
		runErr = errors.Join(runErr, cerr)
	}
	if runErr != nil {
		rep.Error = runErr.Error()
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printSoak(stdout, rep)
	}
	for _, l := range rep.Leaks {
		fmt.Fprintln(stderr, "leak:", l)
	}
	switch {
	case runErr != nil:
		return fmt.Errorf("soak: %w", runErr)
	case len(rep.Leaks) > 0:
		return fmt.Errorf("soak: %d leaks", len(rep.Leaks))
	}
	return nil
}

// cleanup stops the server gracefully and returns what the shutdown left
// of sandboxes. If there is any, or the soak found leftovers, a server
// restarted on the data dir sweeps them (what a restart does after a
// crash) before the data dir goes; what even that leaves is an error.
func (k *soaker) cleanup(ctx context.Context, found []string) ([]string, error) {
	k.s.shutdown()
	defer os.RemoveAll(k.s.dataDir)
	h, err := leaks.Scan()
	if err != nil {
		return nil, err
	}
	left := h.Snapshot(ctx, leaks.Server{DataDir: k.s.dataDir}).SandboxItems(k.s.dataDir)
	if len(found) == 0 && len(left) == 0 {
		return nil, nil
	}
	fmt.Fprintf(k.log, "soak: restarting a server on %s to sweep what is left\n", k.s.dataDir)
	s2, err := startServerIn(ctx, k.s.dataDir, k.o.templatesDir, "--log-level", "warn")
	if err != nil {
		return left, fmt.Errorf("cleanup: %w", err)
	}
	s2.shutdown()
	if h, err = leaks.Scan(); err != nil {
		return left, err
	}
	if still := h.Snapshot(ctx, leaks.Server{DataDir: k.s.dataDir}).SandboxItems(k.s.dataDir); len(still) > 0 {
		return left, fmt.Errorf("cleanup: left on the host after a restart on the data dir:\n  %s", strings.Join(still, "\n  "))
	}
	return left, nil
}

func (k *soaker) run(ctx context.Context) (soakReport, error) {
	o := k.o
	host, _ := os.Hostname()
	rep := soakReport{Date: time.Now().UTC().Format("2006-01-02"), Host: host, Cores: runtime.NumCPU(),
		N: o.n, CheckEvery: o.checkEvery, Concurrency: o.concurrency, Leaks: []string{}}
	admin := k.s.c
	team, err := admin.CreateTeam(ctx, client.CreateTeamRequest{Name: "soak",
		Limits: &client.Limits{MaxSandboxes: o.concurrency + 1, MaxConcurrentExec: o.concurrency + 1}})
	if err != nil {
		return rep, err
	}
	key, err := admin.CreateKey(ctx, client.CreateKeyRequest{Name: "soak", TeamID: team.ID})
	if err != nil {
		return rep, err
	}
	k.c = client.New(admin.BaseURL(), key.Key)
	for _, rt := range o.runtimes {
		k.stats[rt] = &soakRuntime{name: rt, networks: map[string]int{}, phases: map[string]sample{}}
	}

	// Priming: what a server sets up once and keeps for its life.
	for _, rt := range o.runtimes {
		for _, nw := range []string{client.NetworkNone, client.NetworkOutbound} {
			c := k.cycle(ctx, rt, nw, -1)
			if c.err != nil {
				return rep, fmt.Errorf("priming %s/%s: %w", rt, nw, c.err)
			}
		}
	}
	h, err := leaks.Scan()
	if err != nil {
		return rep, err
	}
	k.base = h.Snapshot(ctx, k.srv)
	rep.Baseline = k.base.Counts()

	// The cycles, in order: runtime after runtime, round after round.
	type job struct {
		rt, network string
		seq         int
	}
	var jobs []job
	for i := 0; i < o.n; i++ {
		nw := client.NetworkNone
		if i%2 == 1 {
			nw = client.NetworkOutbound
		}
		for _, rt := range o.runtimes {
			jobs = append(jobs, job{rt, nw, i})
		}
	}
	var samples []serverSample
	var checkTimes sample
	start := time.Now()
	var busy time.Duration
	lastReport := time.Now()
	for done := 0; done < len(jobs); {
		batch := jobs[done:min(done+o.checkEvery, len(jobs))]
		results := make([]soakCycle, len(batch))
		var wg sync.WaitGroup
		next := make(chan int)
		for w := 0; w < o.concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					results[i] = k.cycle(ctx, batch[i].rt, batch[i].network, batch[i].seq)
				}
			}()
		}
		for i := range batch {
			next <- i
		}
		close(next)
		wg.Wait()
		done += len(batch)
		var ids []string
		var cycleErr error
		for _, r := range results {
			if r.id != "" {
				ids = append(ids, r.id)
			}
			k.stats[r.runtime].retries = append(k.stats[r.runtime].retries, r.retries...)
			if r.err != nil {
				cycleErr = errors.Join(cycleErr, fmt.Errorf("%s cycle %d (%s) %s: %w", r.runtime, r.seq, r.network, r.id, r.err))
				continue
			}
			st := k.stats[r.runtime]
			st.cycles++
			st.networks[r.network]++
			for ph, d := range r.d {
				st.phases[ph] = append(st.phases[ph], d)
			}
			st.busy += r.d["cycle"]
			busy += r.d["cycle"]
		}
		t0 := time.Now()
		found := k.check(ctx, ids)
		checkTimes = append(checkTimes, time.Since(t0))
		rep.Checks++
		if sm, err := k.serverSample(); err == nil {
			sm.cycles = batch[len(batch)-1].seq + 1
			samples = append(samples, sm)
		}
		if len(found) > 0 {
			rep.Leaks = append(rep.Leaks, found...)
			for _, l := range found {
				for _, r := range results {
					if r.id != "" && strings.HasPrefix(l, r.id+": ") {
						k.stats[r.runtime].leaks++
					}
				}
			}
			k.fill(&rep, samples, checkTimes, start)
			return rep, cycleErr
		}
		if cycleErr != nil {
			k.fill(&rep, samples, checkTimes, start)
			return rep, cycleErr
		}
		if ctx.Err() != nil {
			k.fill(&rep, samples, checkTimes, start)
			return rep, ctx.Err()
		}
		if time.Since(lastReport) > 30*time.Second {
			lastReport = time.Now()
			last := samples[len(samples)-1]
			fmt.Fprintf(k.log, "soak: %d/%d cycles, %.1f cycles/s in cycles, server RSS %.1f MiB, %d fds, no leak\n",
				done, len(jobs), float64(done)/busy.Seconds(), last.rss, int(last.fds))
		}
	}
	k.fill(&rep, samples, checkTimes, start)
	if rep.RSSMiB.Delta > o.rssSlackMB {
		rep.Leaks = append(rep.Leaks, fmt.Sprintf("server RSS grew %.1f MiB (min %.1f MiB after warm-up, %.1f MiB at the end; bound %.0f MiB)",
			rep.RSSMiB.Delta, rep.RSSMiB.Warm, rep.RSSMiB.End, o.rssSlackMB))
	}
	if rep.FDs.Delta > float64(o.fdSlack) {
		rep.Leaks = append(rep.Leaks, fmt.Sprintf("server open fds grew by %.0f (%.0f after warm-up, %.0f at the end; bound %d)",
			rep.FDs.Delta, rep.FDs.Warm, rep.FDs.End, o.fdSlack))
	}
	return rep, nil
}

// soakProgram is the cycle's command: a file, a daemon that outlives the
// command (a session of its own, so only teardown ends it) and a plain
// background process, then the file's content on stdout.
const soakProgram = `set -e
echo "$1" > /work/exec.txt
setsid sleep 3600 </dev/null >/dev/null 2>&1 &
sleep 3600 </dev/null >/dev/null 2>&1 &
cat /work/exec.txt`

// cycle runs one create → exec → write → read → delete. Its sandbox is
// deleted whatever fails.
func (k *soaker) cycle(ctx context.Context, rt, network string, seq int) (c soakCycle) {
	c = soakCycle{runtime: rt, network: network, seq: seq, d: map[string]time.Duration{}}
	start := time.Now()
	phase := func(name string, f func() error) bool {
		if c.err != nil {
			return false
		}
		t := time.Now()
		if err := f(); err != nil {
			c.err = fmt.Errorf("%s: %w", name, err)
			return false
		}
		c.d[name] = time.Since(t)
		return true
	}
	var sb *client.Sandbox
	phase("create", func() (err error) {
		// A start that failed (503 unavailable: e.g. runsc killed at the
		// start timeout on an overloaded host) says to try again, as a
		// client does: the check after the batch finds whatever it left.
		for attempt := 0; ; attempt++ {
			sb, err = k.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: k.o.template, Runtime: rt, Network: client.Network(network),
				Timeout: 600, Metadata: map[string]string{"soak": strconv.Itoa(seq)}})
			if client.ErrorCode(err) != client.CodeUnavailable || attempt == 4 || ctx.Err() != nil {
				return err
			}
			c.retries = append(c.retries, err.Error())
			time.Sleep(time.Duration(1<<attempt) * time.Second)
		}
	})
	if sb == nil {
		return c
	}
	c.id = sb.ID
	deleted := false
	defer func() {
		if !deleted {
			_ = k.c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		}
	}()
	if network == client.NetworkOutbound && c.err == nil {
		// The mode is really exercised: the sandbox has its host link.
		if !hasLink(sb.ID) {
			c.err = errors.New("outbound sandbox without a host link")
		}
	}
	want := fmt.Sprintf("%s cycle %d %s", rt, seq, sb.ID)
	phase("exec", func() error {
		r, err := k.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", soakProgram, "sh", want}, Timeout: 30})
		if err != nil {
			return err
		}
		if r.ExitCode != 0 || r.Stdout != want+"\n" {
			return fmt.Errorf("exit %d, stdout %q, stderr %q", r.ExitCode, r.Stdout, r.Stderr)
		}
		return nil
	})
	payload := make([]byte, 4096)
	_, _ = rand.Read(payload)
	phase("write", func() error {
		_, err := k.c.WriteFile(ctx, sb.ID, "/work/soak.bin", bytes.NewReader(payload), int64(len(payload)), 0o644)
		return err
	})
	phase("read", func() error {
		rc, _, err := k.c.ReadFile(ctx, sb.ID, "/work/soak.bin")
		if err != nil {
			return err
		}
		defer rc.Close()
		got, err := io.ReadAll(rc)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, payload) {
			return fmt.Errorf("read %d bytes that differ from the %d written", len(got), len(payload))
		}
		return nil
	})
	// Delete runs even after a failed phase; its time counts only then.
	t := time.Now()
	if err := k.c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); err != nil {
		c.err = errors.Join(c.err, fmt.Errorf("delete: %w", err))
	} else {
		deleted = true
		c.d["delete"] = time.Since(t)
	}
	c.d["cycle"] = time.Since(start)
	return c
}

// hasLink reports whether a host link's alias names sandbox id.
func hasLink(id string) bool {
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		alias, _ := os.ReadFile(filepath.Join("/sys/class/net", l.Name(), "ifalias"))
		if strings.HasSuffix(strings.TrimSpace(string(alias)), ":"+id) {
			return true
		}
	}
	return false
}

// check returns what is left of the batch's sandboxes (by id, and their
// rows) and of the server against the baseline, after waiting up to
// --settle for it to go.
//
// The evalbox chains' rules are the host's, not the server's: it writes
// them once, at its first outbound sandbox (before the baseline), and
// never again; another process may (an evalbox server or test of another
// version with other rules). A change to the chains' own rules alone is
// such a rewrite: it is reported apart and becomes the baseline. A jump to
// a chain added or gone, or a rule naming one sandbox's link, is a leak.
func (k *soaker) check(ctx context.Context, ids []string) []string {
	deadline := time.Now().Add(k.o.settle)
	for {
		var found, rewritten []string
		h, err := leaks.Scan()
		if err != nil {
			return []string{err.Error()}
		}
		for _, id := range ids {
			for _, l := range h.ByID(k.s.dataDir, id) {
				found = append(found, id+": "+l)
			}
			sb, err := k.c.GetSandbox(ctx, id)
			switch {
			case err != nil:
				found = append(found, fmt.Sprintf("%s: row: %v", id, err))
			case sb.State == client.StateRunning:
				found = append(found, id+": row still running after delete")
			}
		}
		snap := h.Snapshot(ctx, k.srv)
		for _, l := range snap.Diff(k.base) {
			if isChainRuleDiff(l) {
				rewritten = append(rewritten, l)
				continue
			}
			found = append(found, "server: "+l)
		}
		running, err := k.c.ListSandboxes(ctx, client.ListOptions{})
		if err != nil {
			found = append(found, "rows: "+err.Error())
		}
		for _, sb := range running {
			found = append(found, "rows: sandbox "+sb.ID+" of the soak team is running")
		}
		if len(found) == 0 && len(rewritten) > 0 {
			k.rewrites++
			k.base[leaks.KindIptables] = snap[leaks.KindIptables]
			fmt.Fprintf(k.log, "soak: the evalbox chains were rewritten by another process (not a leak of this server); new baseline:\n  %s\n",
				strings.Join(rewritten, "\n  "))
		}
		if len(found) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return found
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// isChainRuleDiff reports whether a Diff line is about a rule of the
// evalbox chains themselves ("-A EVALBOX-… "), neither a jump to them nor
// a rule naming a sandbox's link.
func isChainRuleDiff(l string) bool {
	rest, ok := strings.CutPrefix(l, leaks.KindIptables+": ")
	if !ok {
		return false
	}
	_, rule, _ := strings.Cut(rest, ": ") // "left"/"gone"
	_, rule, _ = strings.Cut(rule, ": ")  // the table
	return strings.HasPrefix(rule, "-A EVALBOX-") && !leaks.NamesSandboxLink(rule)
}

// serverSample reads the server's RSS (MiB) and open fd count.
func (k *soaker) serverSample() (serverSample, error) {
	pid := strconv.Itoa(k.srv.PID)
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return serverSample{}, err
	}
	var sm serverSample
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			sm.rss = kb / 1024
		}
	}
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		return serverSample{}, err
	}
	sm.fds = float64(len(fds))
	return sm, nil
}
