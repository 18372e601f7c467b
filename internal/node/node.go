// Package node runs sandboxes on one host: it starts them through a runtime
// driver, connects to their guest agent, keeps a warm pool of ready
// sandboxes per (template, runtime, shape), and tears everything down by id.
// It knows nothing of teams, quotas or the API: the control plane
// (internal/sandbox) drives it, in-process on one machine and, later, over
// the network on a fleet.
package node

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/netrules"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// ErrUnknownRuntime is returned for a runtime name the node does not run.
var ErrUnknownRuntime = nodeapi.ErrUnknownRuntime

// Shape is the resources of a sandbox.
type Shape = nodeapi.Shape

// PoolKey says which sandboxes are interchangeable in the warm pool: the
// contract's Spec (template digest, runtime, shape).
type PoolKey = nodeapi.Spec

// Config configures a Node.
type Config struct {
	Runtimes  []runtime.Runtime
	Templates *template.Registry
	// AgentPath is the host path of the static evalbox-agent binary.
	AgentPath string
	// StateDir holds one directory per live sandbox.
	StateDir string
	// SnapshotDir holds the node's snapshots, one directory each ("":
	// the node takes none).
	SnapshotDir string
	// StartTimeout bounds a cold start, agent handshake included.
	StartTimeout time.Duration
	// Build is the shape of template build sandboxes.
	Build BuildConfig
	// Capacity admits every sandbox the node starts against the host's
	// pids and memory (nil: NewCapacity with the host's defaults).
	Capacity *Capacity
	Logger   *slog.Logger
}

// Node runs sandboxes on this host.
type Node struct {
	cfg      Config
	log      *slog.Logger
	runtimes map[string]runtime.Runtime
	names    []string // sorted runtime names

	capacity *Capacity

	mu       sync.Mutex
	live     map[string]*Sandbox
	starting map[string]struct{} // ids inside start, not yet live
	pools    map[PoolKey]*pool
	// held keeps the capacity of sandboxes whose destroy failed: what the
	// driver left may still hold host pids and memory, so the capacity
	// goes back once Sweep finds nothing left of them.
	held map[string]func()
	// sweepSoon (1-buffered) asks SweepEvery for an early sweep: a
	// destroy failed (on a loaded host, a cgroup that would not go in
	// time), and what it left holds capacity until a sweep removes it.
	sweepSoon chan struct{}

	wg     sync.WaitGroup
	closed chan struct{}
	// closing is cancelled with closed: capacity waits end with it.
	closing context.Context
	stop    context.CancelFunc
}

// Sandbox is one live sandbox on this node.
type Sandbox struct {
	ID             string
	Template       *template.Template
	Runtime        string
	RuntimeVersion string
	Shape          Shape
	// StartedAt is when the sandbox was started (for pooled ones, before
	// they were claimed).
	StartedAt time.Time
	// FromPool is set when a Create was served from the warm pool.
	FromPool bool
	// Agent is the session with the guest agent.
	Agent *agentproto.Client

	rtMu     sync.RWMutex
	rt       runtime.Sandbox // a paused sandbox's is its stopped one
	stateDir string
	// op serialises snapshots, pauses and resumes; paused is set while
	// the sandbox is paused (see snapshot.go).
	op     sync.Mutex
	paused atomic.Bool
	pause  *pauseImage // under op
	// egress is the rules in force (SetEgress), which a resume restores
	// with the sandbox.
	egress atomic.Pointer[netrules.Rules]
	// release gives the sandbox's host capacity back.
	release func()
	once    sync.Once
	// destroyed is set when destroy begins: Wait tells a destroyed
	// sandbox from one whose agent went away.
	destroyed atomic.Bool
	// env is the create's environment (SetEnv): under every exec's.
	env atomic.Pointer[map[string]string]
	// secrets: SetSecrets.
	secrets atomic.Pointer[map[string]string]
	// given is set once Create handed the sandbox out (a pool's are not
	// until claimed).
	given atomic.Bool
}

// SetEgress limits the sandbox's egress to e (nil: no limit). It needs an
// outbound sandbox (a conflict otherwise); rules that do not parse are a
// bad request. On error the previous rules stay.
func (s *Sandbox) SetEgress(ctx context.Context, e *nodeapi.Egress) error {
	if s.Shape.Network != runtime.NetworkOutbound {
		return &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("sandbox %s has no network to set egress rules on", s.ID)}
	}
	var rules *netrules.Rules
	if e != nil {
		r, err := netrules.Parse(e.Allow, e.Deny)
		if err != nil {
			return &apierr.Error{Code: client.CodeBadRequest, Message: err.Error()}
		}
		rules = r
	}
	f, ok := s.runtime().(runtime.EgressFilter)
	if !ok {
		return fmt.Errorf("node: the %s runtime cannot filter a sandbox's egress", s.Runtime)
	}
	if err := f.SetEgress(ctx, rules); err != nil {
		return fmt.Errorf("node: egress rules of %s: %w", s.ID, err)
	}
	s.egress.Store(rules)
	return nil
}

// runtime returns the sandbox's runtime sandbox (Resume replaces it).
func (s *Sandbox) runtime() runtime.Sandbox {
	s.rtMu.RLock()
	defer s.rtMu.RUnlock()
	return s.rt
}

// SetEnv sets the environment that every exec and process of the sandbox
// gets under its own (the create's env; nil: none).
func (s *Sandbox) SetEnv(env map[string]string) {
	if len(env) == 0 {
		s.env.Store(nil)
		return
	}
	env = maps.Clone(env)
	s.env.Store(&env)
}

// SetSecrets sets the sandbox's secrets: environment variables that every
// exec and process gets as it gets SetEnv's (over them), but which are
// kept apart: a snapshot keeps the environment, never the secrets.
func (s *Sandbox) SetSecrets(secrets map[string]string) {
	if len(secrets) == 0 {
		s.secrets.Store(nil)
		return
	}
	secrets = maps.Clone(secrets)
	s.secrets.Store(&secrets)
}

// BaseEnv returns the sandbox's environment (SetEnv), without its secrets:
// what a snapshot keeps. The result is not shared.
func (s *Sandbox) BaseEnv() map[string]string {
	p := s.env.Load()
	if p == nil {
		return nil
	}
	return maps.Clone(*p)
}

// ExecEnv returns the environment of an exec that asks for env: the
// sandbox's (SetEnv), its secrets (SetSecrets) over it, and env's entries
// over both. The result is shared with none of them.
func (s *Sandbox) ExecEnv(env map[string]string) map[string]string {
	p, q := s.env.Load(), s.secrets.Load()
	if p == nil && q == nil {
		return env
	}
	out := map[string]string{}
	if p != nil {
		maps.Copy(out, *p)
	}
	if q != nil {
		maps.Copy(out, *q)
	}
	maps.Copy(out, env)
	return out
}

// Done is closed when the sandbox's agent session ends (the sandbox died or
// was destroyed).
func (s *Sandbox) Done() <-chan struct{} { return s.Agent.Done() }

// OOMKills reports how many of the sandbox's processes the OOM killer has
// killed (0 when it cannot tell).
func (s *Sandbox) OOMKills() int64 {
	n, err := s.runtime().OOMKills()
	if err != nil {
		return 0
	}
	return n
}

// New returns a node. Call Sweep once before use to remove what a previous
// process left, and Close to stop it.
func New(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	cfg.Build.setDefaults()
	if cfg.Capacity == nil {
		c, err := NewCapacity(CapacityConfig{})
		if err != nil {
			return nil, err
		}
		cfg.Capacity = c
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n := &Node{
		cfg: cfg, log: cfg.Logger, capacity: cfg.Capacity,
		runtimes: map[string]runtime.Runtime{},
		live:     map[string]*Sandbox{},
		starting: map[string]struct{}{},
		pools:    map[PoolKey]*pool{},
		held:     map[string]func(){},
		closed:   make(chan struct{}),

		sweepSoon: make(chan struct{}, 1),
	}
	n.closing, n.stop = context.WithCancel(context.Background())
	for _, r := range cfg.Runtimes {
		n.runtimes[r.Name()] = r
		n.names = append(n.names, r.Name())
	}
	sort.Strings(n.names)
	return n, nil
}

// Runtimes lists the runtime names this node runs, sorted.
func (n *Node) Runtimes() []string { return n.names }

// Sweep removes every sandbox a previous process of this node left behind
// (runtime state, cgroups, processes, state directories). Nothing of them
// can be reattached: their agent sessions were pipes of that process.
func (n *Node) Sweep(ctx context.Context) ([]string, error) {
	keep := func(id string) bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		_, live := n.live[id]
		_, starting := n.starting[id]
		return live || starting
	}
	var removed []string
	var errs []error
	for _, r := range n.runtimes {
		ids, err := r.Sweep(ctx, keep)
		removed = append(removed, ids...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	entries, _ := os.ReadDir(n.cfg.StateDir)
	for _, e := range entries {
		if !keep(e.Name()) {
			if err := os.RemoveAll(filepath.Join(n.cfg.StateDir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, n.sweepSnapshots()...)
	n.mu.Lock()
	held := maps.Clone(n.held)
	n.mu.Unlock()
	for id, release := range held {
		if left := n.Leftovers(id); len(left) == 0 {
			n.mu.Lock()
			delete(n.held, id)
			n.mu.Unlock()
			release()
			n.log.Info("capacity of a failed destroy given back: nothing of it is left", "sandbox", id)
		}
	}
	if len(errs) > 0 {
		// Something could not be removed this time: SweepEvery tries
		// again soon rather than an interval later.
		select {
		case n.sweepSoon <- struct{}{}:
		default:
		}
	}
	return removed, errors.Join(errs...)
}

// SweepEvery runs Sweep every interval until the node closes: whatever a
// failed destroy left on the host is removed then. A failed destroy, or a
// sweep that could not remove everything, asks for an early sweep too,
// firstAfterFailure later, then at doubling delays while the node still
// holds capacity for what is left or the sweep still fails (a loaded host
// frees a busy cgroup in seconds, not in an interval).
func (n *Node) SweepEvery(interval time.Duration) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		var early <-chan time.Time
		delay := firstAfterFailure
		for {
			select {
			case <-n.closed:
				return
			case <-n.sweepSoon:
				if early == nil {
					early = time.After(delay)
				}
				continue
			case <-early:
			case <-t.C:
			}
			early = nil
			ctx, cancel := context.WithTimeout(context.Background(), interval)
			removed, err := n.Sweep(ctx)
			cancel()
			if len(removed) > 0 || err != nil {
				n.log.Warn("swept sandbox leftovers", "ids", removed, "err", err)
			}
			n.mu.Lock()
			holding := len(n.held) > 0 || err != nil
			n.mu.Unlock()
			if holding && 2*delay < interval {
				delay *= 2
				early = time.After(delay)
			} else if !holding {
				delay = firstAfterFailure
			}
		}
	}()
}

// firstAfterFailure is how long after a failed destroy SweepEvery sweeps.
const firstAfterFailure = 2 * time.Second

// NewID returns a fresh sandbox id.
func NewID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "sb-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// Create returns a running sandbox of key's template, runtime and shape:
// claimed from the warm pool when one is ready (it holds its capacity
// already), else cold-started. A cold start first reserves its host cost
// from the node's Capacity, queueing up to wait for it (0: not at all;
// < 0: until ctx ends); not getting it is a *CapacityError.
func (n *Node) Create(ctx context.Context, key PoolKey, wait time.Duration) (*Sandbox, error) {
	if _, ok := n.runtimes[key.Runtime]; !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownRuntime, key.Runtime)
	}
	if sb := n.claim(key); sb != nil {
		sb.given.Store(true)
		return sb, nil
	}
	sb, err := n.start(ctx, key, func(ctx context.Context, cost runtime.Resources) (func(), error) {
		return n.reserve(ctx, cost, wait)
	}, nil)
	if err != nil {
		return nil, err
	}
	sb.given.Store(true)
	return sb, nil
}

// DestroyGiven destroys every sandbox Create handed out, and keeps the warm
// pools: what a node does when the control plane has ended its sandboxes
// without it (it counted the node lost). It returns how many it destroyed.
func (n *Node) DestroyGiven(ctx context.Context) (int, error) {
	n.mu.Lock()
	var given []*Sandbox
	for _, sb := range n.live {
		if sb.given.Load() {
			given = append(given, sb)
		}
	}
	n.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(given))
	for i, sb := range given {
		wg.Go(func() { errs[i] = n.destroy(ctx, sb) })
	}
	wg.Wait()
	return len(given), errors.Join(errs...)
}

// HostCost is what a sandbox of key takes of the host's capacity.
func (n *Node) HostCost(key PoolKey) (runtime.Resources, error) {
	rt, ok := n.runtimes[key.Runtime]
	if !ok {
		return runtime.Resources{}, fmt.Errorf("%w: %q", ErrUnknownRuntime, key.Runtime)
	}
	return hostCost(rt, key.Shape)
}

func hostCost(rt runtime.Runtime, sh Shape) (runtime.Resources, error) {
	cost := rt.HostCost(runtime.Spec{CPU: sh.CPU, MemoryMB: sh.MemoryMB, DiskMB: sh.DiskMB, Pids: sh.Pids, Network: sh.Network})
	if cost.Pids <= 0 || cost.MemoryBytes <= 0 {
		// Unlimited cannot be admitted against the host's capacity.
		return cost, fmt.Errorf("node: a sandbox needs a pids and a memory limit (shape %+v)", sh)
	}
	return cost, nil
}

// Capacity returns the node's host capacity.
func (n *Node) Capacity() *Capacity { return n.capacity }

// reserve reserves cost from the node's capacity, waiting up to wait; the
// wait ends when the node closes.
func (n *Node) reserve(ctx context.Context, cost runtime.Resources, wait time.Duration) (func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(n.closing, cancel)
	defer stop()
	release, err := n.capacity.Reserve(ctx, cost, wait)
	if err != nil && n.closing.Err() != nil {
		return nil, ErrClosed
	}
	return release, err
}

// admitFunc reserves a start's host cost: Create waits in the capacity's
// queue, refills only take what is free.
type admitFunc func(ctx context.Context, cost runtime.Resources) (release func(), err error)

// ErrClosed is returned by Create once the node is closing.
var ErrClosed = nodeapi.ErrNodeClosed

// start cold-starts a sandbox once admit reserved its host cost. On error
// nothing is left behind (and nothing reserved). The sandbox joins the
// live set only once its agent answered, so Close never sees a
// half-started one: it waits for starts in flight instead.
//
// With from, the sandbox is restored from that snapshot instead of booted:
// its agent's session is resumed, and the template's ready_cmd is not run
// again (it ran in the snapshot's source).
func (n *Node) start(ctx context.Context, key PoolKey, admit admitFunc, from *snapshotSource) (_ *Sandbox, err error) {
	rt, ok := n.runtimes[key.Runtime]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownRuntime, key.Runtime)
	}
	// The control plane resolved the template's name; the digest finds
	// its files here.
	tpl, err := n.cfg.Templates.ByDigest(key.Template)
	if errors.Is(err, template.ErrNotFound) {
		return nil, &nodeapi.TemplateMissingError{Digest: key.Template}
	}
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	cost, err := hostCost(rt, key.Shape)
	if err != nil {
		return nil, err
	}
	// Waiting for capacity happens before the start joins n.wg: Close
	// ends the wait rather than waiting for it.
	release, err := admit(ctx, cost)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	if n.isClosed() {
		n.mu.Unlock()
		release()
		return nil, ErrClosed
	}
	n.wg.Add(1)
	n.mu.Unlock()
	defer n.wg.Done()

	ctx, cancel := context.WithTimeout(ctx, n.cfg.StartTimeout)
	defer cancel()
	id := NewID()
	n.mu.Lock()
	n.starting[id] = struct{}{}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.starting, id)
		n.mu.Unlock()
	}()
	stateDir := filepath.Join(n.cfg.StateDir, id)
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		release()
		return nil, fmt.Errorf("node: %w", err)
	}
	// From here on destroy gives the capacity back.
	sb := &Sandbox{ID: id, Template: tpl, Runtime: rt.Name(), RuntimeVersion: rt.Version(),
		Shape: key.Shape, StartedAt: time.Now(), stateDir: stateDir, release: release}
	defer func() {
		if err != nil {
			n.destroy(context.WithoutCancel(ctx), sb)
		}
	}()
	spec := runtimeSpec(id, tpl, key, stateDir, n.cfg.AgentPath)
	switch {
	case from != nil && from.memory:
		spec.Egress = from.egress
		sb.egress.Store(from.egress)
		rr, ok := rt.(runtime.Restorer)
		if !ok {
			return nil, fmt.Errorf("node: the %s runtime cannot restore snapshots", rt.Name())
		}
		if sb.rt, err = rr.Restore(ctx, spec, from.image); err != nil {
			return nil, fmt.Errorf("node: restore %s from snapshot %s: %w", id, from.id, err)
		}
		if sb.Agent, err = agentproto.Redial(sb.rt.Conn(), from.nonce); err != nil {
			return nil, fmt.Errorf("node: agent %s: %w", id, err)
		}
	case from != nil:
		// A snapshot of files: a fresh boot on them.
		ui, ok := rt.(runtime.UpperImporter)
		if !ok {
			return nil, fmt.Errorf("node: the %s runtime cannot start from a snapshot of files", rt.Name())
		}
		if sb.rt, err = ui.StartWithUpper(ctx, spec, filepath.Join(from.image, upperArchive)); err != nil {
			return nil, fmt.Errorf("node: start %s from snapshot %s: %w", id, from.id, err)
		}
		if sb.Agent, err = agentproto.Dial(sb.rt.Conn()); err != nil {
			return nil, fmt.Errorf("node: agent %s: %w", id, err)
		}
		if from.egress != nil {
			// Before any of its commands runs: only its agent does yet.
			ef, ok := sb.rt.(runtime.EgressFilter)
			if !ok {
				return nil, fmt.Errorf("node: the %s runtime cannot filter a sandbox's egress", rt.Name())
			}
			if err := ef.SetEgress(ctx, from.egress); err != nil {
				return nil, fmt.Errorf("node: egress rules of %s: %w", id, err)
			}
			sb.egress.Store(from.egress)
		}
	default:
		if sb.rt, err = rt.Start(ctx, spec); err != nil {
			return nil, fmt.Errorf("node: start %s: %w", id, err)
		}
		if sb.Agent, err = agentproto.Dial(sb.rt.Conn()); err != nil {
			return nil, fmt.Errorf("node: agent %s: %w", id, err)
		}
	}
	if err := sb.Agent.Ping(ctx); err != nil {
		return nil, fmt.Errorf("node: agent %s did not answer: %w", id, err)
	}
	if from == nil || !from.memory {
		if err := readyCheck(ctx, sb); err != nil {
			return nil, err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.isClosed() {
		return nil, ErrClosed
	}
	n.live[id] = sb
	return sb, nil
}

// runtimeSpec is the runtime's spec of sandbox id of template tpl.
func runtimeSpec(id string, tpl *template.Template, key PoolKey, stateDir, agentPath string) runtime.Spec {
	return runtime.Spec{
		ID: id, RootFS: tpl.RootFS, AgentPath: agentPath,
		AgentArgs: []string{"--workdir", tpl.Defaults.Workdir, "--user", tpl.Defaults.User},
		Env:       tpl.EnvList(), StateDir: stateDir,
		CPU: key.Shape.CPU, MemoryMB: key.Shape.MemoryMB, DiskMB: key.Shape.DiskMB, Pids: key.Shape.Pids,
		Network: key.Shape.Network, Hostname: id,
	}
}

func (n *Node) isClosed() bool {
	select {
	case <-n.closed:
		return true
	default:
		return false
	}
}

// Destroy kills a sandbox and removes everything of it. Unknown ids are not
// an error (it is idempotent).
func (n *Node) Destroy(ctx context.Context, id string) error {
	n.mu.Lock()
	sb, ok := n.live[id]
	n.mu.Unlock()
	if !ok {
		return nil
	}
	return n.destroy(ctx, sb)
}

func (n *Node) destroy(ctx context.Context, sb *Sandbox) error {
	var err error
	sb.once.Do(func() {
		// Before the runtime is read: a resume in flight sees it and
		// destroys what it restored itself (Resume).
		sb.destroyed.Store(true)
		if sb.Agent != nil {
			_ = sb.Agent.Close()
		}
		if rt := sb.runtime(); rt != nil {
			err = rt.Destroy(ctx)
		}
		rtErr := err
		if rmErr := os.RemoveAll(sb.stateDir); rmErr != nil {
			err = errors.Join(err, rmErr)
		}
		n.mu.Lock()
		delete(n.live, sb.ID)
		release := sb.release
		sb.release = nil
		if rtErr != nil && release != nil {
			// Its processes or cgroups may still hold host pids and
			// memory: the capacity stays taken until Sweep removed them.
			n.held[sb.ID] = release
			release = nil
		}
		n.mu.Unlock()
		if rtErr != nil {
			select {
			case n.sweepSoon <- struct{}{}:
			default:
			}
		}
		if release != nil {
			release()
		}
		if err != nil {
			n.log.Error("destroy sandbox", "sandbox", sb.ID, "err", err)
		}
	})
	return err
}

// Leftovers lists what the host still holds for a sandbox id, across
// runtimes and the node's own state. Empty after Destroy.
func (n *Node) Leftovers(id string) []string {
	var left []string
	for _, r := range n.runtimes {
		left = append(left, r.Leftovers(id)...)
	}
	if _, err := os.Stat(filepath.Join(n.cfg.StateDir, id)); err == nil {
		left = append(left, "state dir "+filepath.Join(n.cfg.StateDir, id))
	}
	return left
}

// Close stops pool refills and destroys every sandbox of the node.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if n.isClosed() {
		n.mu.Unlock()
		return nil
	}
	close(n.closed)
	n.stop()
	n.mu.Unlock()
	// Refills and starts in flight see closed and clean up after themselves.
	n.wg.Wait()
	n.mu.Lock()
	all := make([]*Sandbox, 0, len(n.live))
	for _, sb := range n.live {
		all = append(all, sb)
	}
	n.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(all))
	for i, sb := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.destroy(ctx, sb)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
