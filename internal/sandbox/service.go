// Package sandbox is the control plane's sandbox service: it validates
// requests, admits them against the team's quotas, records every sandbox in
// the store, asks the node to run it, enforces its TTL and ends it, also when
// it dies on its own. Exec and file calls are checked against the caller's
// team and forwarded to the node. It knows the node only through the node
// contract (internal/nodeapi): in process or over the network alike.
package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// Store is what the service needs of the state store.
type Store interface {
	InsertSandbox(ctx context.Context, sb client.Sandbox) (client.Sandbox, error)
	GetSandbox(ctx context.Context, teamID, id string) (client.Sandbox, error)
	ListSandboxes(ctx context.Context, teamID string, f store.SandboxFilter) ([]client.Sandbox, error)
	SetExpiry(ctx context.Context, teamID, id string, t time.Time) error
	MarkEnded(ctx context.Context, id, state, reason string, at time.Time) (bool, error)
	ListByState(ctx context.Context, state string) ([]client.Sandbox, error)
	ListRunningOn(ctx context.Context, nodeID string) ([]client.Sandbox, error)
	ListExpired(ctx context.Context, now time.Time) ([]client.Sandbox, error)
	MarkExpired(ctx context.Context, id string, now time.Time) (bool, error)
	GetTeam(ctx context.Context, id string) (client.Team, error)

	// The team's sandbox slots in the database (store.TakeSlot): the
	// authority on its active-sandbox limit across API replicas.
	TakeSlot(ctx context.Context, teamID, replica string, ttl time.Duration) (string, error)
	ReleaseSlot(ctx context.Context, id string) error
	RenewSlots(ctx context.Context, replica string, ttl time.Duration) error
	InsertSandboxInSlot(ctx context.Context, sb client.Sandbox, slotID string) (client.Sandbox, error)
	ListRunningOnNode(ctx context.Context, nodeID string) ([]client.Sandbox, error)

	// Access (access.go).
	GetSandboxAnyTeam(ctx context.Context, id string) (client.Sandbox, error)
	SetNetwork(ctx context.Context, teamID, id, mode string, rules *client.NetworkRuleLists) error
	SetPorts(ctx context.Context, teamID, id string, ports []client.PortSpec) error
	SetTrafficTokenHash(ctx context.Context, teamID, id, hash string) error

	// Snapshots and pauses (snapshot.go).
	InsertSnapshot(ctx context.Context, sn client.Snapshot) (client.Snapshot, error)
	GetSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error)
	ListSnapshots(ctx context.Context, teamID string) ([]client.Snapshot, error)
	DeleteSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error)
	SetPaused(ctx context.Context, teamID, id string, at *time.Time) error

	// The CPU-abuse rule's warning and throttle of a running sandbox
	// (abuse.go).
	SetCPUAbuseWarned(ctx context.Context, id string, at time.Time) error
	SetCPUThrottled(ctx context.Context, id string, at time.Time) error
}

// Templates resolves the template a team names for a new sandbox.
type Templates interface {
	// Acquire returns the team's template name (a built-in or one of the
	// team's; "" team: built-ins only) and keeps its files until release
	// is called. An unknown name is a *apierr.Error with CodeNotFound.
	Acquire(ctx context.Context, teamID, name string) (tpl *template.Template, release func(), err error)
}

// Config holds the service's limits and defaults.
type Config struct {
	DefaultRuntime string
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// Per-sandbox maxima.
	MaxCPU      float64
	MaxMemoryMB int
	MaxDiskMB   int
	// Pids is the task limit of every sandbox (0: DefaultPids).
	Pids int
	// MaxWait bounds wait_seconds of a create request.
	MaxWait time.Duration
	// ExecWait is how long an exec queues for a slot when the team is at
	// its concurrent-exec limit before failing with rate_limited (0: 10
	// minutes; negative: not at all).
	ExecWait time.Duration
	// MaxOutputBytes is the default cap of stdout and stderr, each, of an
	// exec; MaxOutputLimit the largest cap a request may ask for (output is
	// held in server memory for buffered calls). MaxFileBytes is the
	// largest upload.
	MaxOutputBytes int64
	MaxOutputLimit int64
	MaxFileBytes   int64
	// ReapInterval is how often the TTL reaper looks for expired sandboxes.
	ReapInterval time.Duration
	// NodeID is the node id recorded on the rows of sandboxes the node
	// does not name (SandboxInfo.Node): the embedded node's. Recover ends
	// that node's rows (and rows of no node) as lost across a restart.
	NodeID string
	// Exclusive says that no other server uses the database (SQLite):
	// Recover then ends every running row of no live node, whatever its
	// node, and creates take no database slot.
	Exclusive bool
	// NodeLive, when set, says whether a node is live (a fleet): at
	// start, Recover marks lost only the running rows of nodes that are
	// not live; the others are still running there.
	NodeLive func(nodeID string) bool
	// ContentDigest, when set, gives the content digest of a template
	// (template.Registry.ContentDigest) that a create sends, so that a
	// node that lacks the template fetches and verifies it. Nil: none is
	// sent (the embedded node has every template).
	ContentDigest func(ctx context.Context, digest string) (string, error)
	// ReplicaID names this API replica in the team slots its creates
	// hold in the database (default: "local").
	ReplicaID string
	// SlotTTL is how long a create's team slot outlives its replica's
	// last renewal (renewed every SlotTTL/6): what a replica that dies
	// mid-create holds its teams' slots for (0: 1 minute).
	SlotTTL time.Duration
	// Storage accounts for what teams store, snapshots included (nil: no
	// limit).
	Storage *quota.Storage
	// Secrets opens the team secrets a create names (secret_refs); nil:
	// a create that names one is refused.
	Secrets SecretResolver
	// Tariffs resolves the tariff a create names, or DefaultTariff (""
	// = "standard"), which prices the sandboxes created without one; nil:
	// sandboxes have no tariff.
	Tariffs       Tariffs
	DefaultTariff string
	// Billing, when set, refuses creates their team's balance cannot
	// cover (402 insufficient_balance).
	Billing Billing
	// CPUAbuse is the CPU-abuse rule (abuse.go); its zero Window turns it
	// off.
	CPUAbuse CPUAbuseConfig
}

// DefaultPids is the default task limit of a sandbox.
const DefaultPids = 1024

func (c *Config) setDefaults() {
	if c.DefaultRuntime == "" {
		c.DefaultRuntime = client.RuntimeGVisor
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 5 * time.Minute
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = 24 * time.Hour
	}
	if c.MaxCPU == 0 {
		c.MaxCPU = 8
	}
	if c.MaxMemoryMB == 0 {
		c.MaxMemoryMB = 8192
	}
	if c.MaxDiskMB == 0 {
		c.MaxDiskMB = 10240
	}
	if c.Pids == 0 {
		c.Pids = DefaultPids
	}
	if c.MaxWait == 0 {
		c.MaxWait = 10 * time.Minute
	}
	if c.ExecWait == 0 {
		c.ExecWait = 10 * time.Minute
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = 16 << 20
	}
	if c.MaxOutputLimit == 0 {
		c.MaxOutputLimit = max(128<<20, c.MaxOutputBytes)
	}
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = 1 << 30
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = time.Second
	}
	if c.ReplicaID == "" {
		c.ReplicaID = "local"
	}
	if c.SlotTTL == 0 {
		c.SlotTTL = time.Minute
	}
	if c.Storage == nil {
		c.Storage = quota.NewStorage(func(context.Context, string) (int64, error) { return 0, nil })
	}
}

// Service is the control plane's sandbox service.
type Service struct {
	cfg       Config
	store     Store
	node      nodeapi.Node
	templates Templates
	log       *slog.Logger

	sandboxSlots *quota.Limiter
	execSlots    *quota.Limiter
	m            *metrics // metrics.go

	mu      sync.Mutex
	live    map[string]*entry
	closing bool // set by Close: no sandbox joins live any more

	teamMu    sync.Mutex
	teamCache map[string]cachedTeam
	// tariffCache holds tariffs read for creates and the CPU-abuse rule
	// (tariff.go), as teamCache does teams.
	tariffMu    sync.Mutex
	tariffCache map[string]cachedTariff

	stop chan struct{}
	wg   sync.WaitGroup
}

type cachedTeam struct {
	team client.Team
	at   time.Time
}

// entry is a running sandbox the service owns.
type entry struct {
	row     client.Sandbox
	release func() // gives the team's sandbox slot back (this process's)
	expires time.Time
	ended   chan struct{}
	// life ends when the service ends or forgets the sandbox (stopWatch):
	// the watch's Wait and background processes' waits use it.
	life      context.Context
	stopWatch context.CancelFunc
	endOnce   sync.Once
	oomSeen   atomic.Int64 // OOM kills already reported on an exec
	watches   atomic.Int32 // directory watches open (WatchDir)
	// netMu serialises this replica's network updates of the sandbox, so
	// that the node and the row end on the same one.
	netMu sync.Mutex
	// oomEnded is set, before endOnce is done, when the sandbox ended
	// lost after the OOM killer acted in it; died when it ended because
	// its agent went away (not ended by the server: a delete, its TTL, a
	// shutdown).
	oomEnded, died bool
}

// New returns the service. Call Recover once before serving and Close at
// shutdown.
func New(cfg Config, st Store, n nodeapi.Node, templates Templates, log *slog.Logger) *Service {
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Service{
		cfg: cfg, store: st, node: n, templates: templates, log: log,
		sandboxSlots: quota.NewLimiter(), execSlots: quota.NewLimiter(), m: newMetrics(),
		live: map[string]*entry{}, teamCache: map[string]cachedTeam{}, tariffCache: map[string]cachedTariff{},
		stop: make(chan struct{}),
	}
	if s.cfg.CPUAbuse.Limits == nil && s.cfg.Tariffs != nil {
		s.cfg.CPUAbuse.Limits = s.tariffAbuseLimits
	}
	s.wg.Add(1)
	go s.reaper()
	s.startCPUAbuse()
	if !cfg.Exclusive { // no database slots to renew otherwise
		s.wg.Add(1)
		go s.renewSlots()
	}
	return s
}

// renewSlots keeps the team slots this replica's creates hold in the
// database from expiring.
func (s *Service) renewSlots() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.SlotTTL / 6)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.SlotTTL/6)
			if err := s.store.RenewSlots(ctx, s.cfg.ReplicaID, s.cfg.SlotTTL); err != nil {
				s.log.Warn("renewing team slots", "err", err)
			}
			cancel()
		}
	}
}

// Recover marks running rows whose sandboxes are gone as lost: after a
// restart, those of this service's node (its processes are gone; the
// node sweeps what is left of them on the host), and in a fleet
// (Config.NodeLive) those of nodes that are not live. Rows of other
// embedded servers' nodes, and of live fleet nodes (still running there),
// are left alone; a database that is this server's alone
// (Config.Exclusive) has no other servers' rows.
func (s *Service) Recover(ctx context.Context) error {
	var rows []client.Sandbox
	var err error
	if s.cfg.Exclusive || s.cfg.NodeLive != nil {
		rows, err = s.store.ListByState(ctx, client.StateRunning)
	} else {
		rows, err = s.store.ListRunningOnNode(ctx, s.cfg.NodeID)
	}
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	for _, row := range rows {
		s.mu.Lock()
		_, live := s.live[row.ID]
		s.mu.Unlock()
		if live {
			continue
		}
		reason := "server restarted"
		switch {
		case s.fleet() && IsLocalNode(row.NodeID) && !s.cfg.Exclusive:
			continue // an embedded server's, on a shared database
		case s.fleet() && row.NodeID != "" && s.adopt(row) != nil:
			// Still running on its node: watched from now on (its death
			// is noticed even if no call comes).
			continue
		case s.fleet() && row.NodeID != "":
			reason = (&nodeapi.NodeLostError{NodeID: row.NodeID, Why: "it is not live"}).Error()
		}
		if _, err := s.store.MarkEnded(ctx, row.ID, client.StateLost, reason, time.Now()); err != nil {
			return fmt.Errorf("recover %s: %w", row.ID, err)
		}
		s.log.Info("sandbox lost across restart", "sandbox", row.ID, "team", row.TeamID, "node", row.NodeID, "reason", reason)
	}
	return nil
}

// NodeLost ends every running sandbox of a node that was lost: those this
// service runs end as lost with reason (their team slots released), as
// their Waits and calls fail; rows no one here runs (another replica's,
// one that is gone) are marked lost in the store. It is idempotent.
func (s *Service) NodeLost(ctx context.Context, nodeID, reason string) error {
	rows, err := s.store.ListRunningOn(ctx, nodeID)
	if err != nil {
		return fmt.Errorf("sandbox: drain node %s: %w", nodeID, err)
	}
	var mine []*entry
	for _, row := range rows {
		s.mu.Lock()
		e, live := s.live[row.ID]
		s.mu.Unlock()
		if live {
			mine = append(mine, e)
			continue
		}
		if _, err := s.store.MarkEnded(ctx, row.ID, client.StateLost, reason, time.Now()); err != nil {
			return fmt.Errorf("sandbox: drain node %s: %w", nodeID, err)
		}
	}
	s.endAll(ctx, mine, client.StateLost, reason)
	s.log.Warn("node lost: its sandboxes ended", "node", nodeID, "sandboxes", len(rows), "reason", reason)
	return nil
}

// Close ends every running sandbox (state "deleted", reason "server
// shutdown") and stops the reaper; in a fleet it leaves them running on
// their nodes (forget), for the other replicas to serve.
func (s *Service) Close(ctx context.Context) error {
	close(s.stop)
	s.mu.Lock()
	s.closing = true
	all := slices.Collect(maps.Values(s.live))
	s.mu.Unlock()
	if s.fleet() {
		// The sandboxes are the nodes', not this replica's: they go on
		// running there, for the other replicas (and this one once it is
		// back) to serve and to end at their TTL.
		for _, e := range all {
			s.forget(e)
		}
	} else {
		s.endAll(ctx, all, client.StateDeleted, "server shutdown")
	}
	// The reaper and the watchers of the ended sandboxes return now.
	s.wg.Wait()
	return nil
}

// localNodePrefix starts the id of an embedded server's node (LocalNodeID).
const localNodePrefix = "local:"

// LocalNodeID names the node of an embedded server: its host and its data
// dir's instance id, stable across restarts.
func LocalNodeID(host, instance string) string { return localNodePrefix + host + ":" + instance }

// IsLocalNode reports whether id names an embedded server's node (which
// only that server reaches).
func IsLocalNode(id string) bool { return strings.HasPrefix(id, localNodePrefix) }

// fleet reports whether the sandboxes run on a fleet's nodes, which any
// replica reaches, rather than on a node of this process.
func (s *Service) fleet() bool { return s.cfg.NodeLive != nil }

// forget stops serving e without ending it (a replica of a fleet that
// shuts down): its watch stops and this process's slot is given back.
func (s *Service) forget(e *entry) {
	e.endOnce.Do(func() {
		close(e.ended)
		e.stopWatch()
		s.mu.Lock()
		if s.live[e.row.ID] == e {
			delete(s.live, e.row.ID)
		}
		s.mu.Unlock()
		e.release()
	})
}

// adopt returns the entry of a running sandbox that another replica of the
// fleet created (or this one before a restart), served from now on by
// this one as well: nil when its node is not live (the drain of that node
// ends it) or the service is closing. The node holds what a call needs
// (the sandbox's env); the sandbox's row holds the team's slot.
func (s *Service) adopt(row client.Sandbox) *entry {
	if !s.fleet() || row.NodeID == "" || !s.cfg.NodeLive(row.NodeID) {
		return nil
	}
	s.mu.Lock()
	if e, ok := s.live[row.ID]; ok {
		s.mu.Unlock()
		return e
	}
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	e := &entry{row: row, release: func() {}, expires: row.ExpiresAt, ended: make(chan struct{}), life: watchCtx, stopWatch: stopWatch}
	s.live[row.ID] = e
	s.wg.Add(1)
	s.mu.Unlock()
	go s.watch(watchCtx, e)
	s.log.Info("sandbox adopted", "sandbox", row.ID, "team", row.TeamID, "node", row.NodeID)
	return e
}

// entryOf returns the entry that serves row: this service's own, or in a
// fleet one adopted now; nil when none can (another server's node, a node
// that is not live).
func (s *Service) entryOf(row client.Sandbox) *entry {
	s.mu.Lock()
	e, ok := s.live[row.ID]
	s.mu.Unlock()
	if ok {
		return e
	}
	return s.adopt(row)
}

// endAll ends sandboxes concurrently, a few at a time.
func (s *Service) endAll(ctx context.Context, es []*entry, state, reason string) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, e := range es {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.end(ctx, e, state, reason)
		}()
	}
	wg.Wait()
}

// Team returns a team's record, cached for a few seconds: limits are read
// on every create and exec.
func (s *Service) Team(ctx context.Context, teamID string) (client.Team, error) {
	s.teamMu.Lock()
	c, ok := s.teamCache[teamID]
	s.teamMu.Unlock()
	if ok && time.Since(c.at) < 2*time.Second {
		return c.team, nil
	}
	t, err := s.store.GetTeam(ctx, teamID)
	if err != nil {
		return client.Team{}, fmt.Errorf("team %s: %w", teamID, err)
	}
	s.teamMu.Lock()
	s.teamCache[teamID] = cachedTeam{team: t, at: time.Now()}
	s.teamMu.Unlock()
	return t, nil
}

// ForgetTeam drops a team from the cache (after its limits changed).
func (s *Service) ForgetTeam(teamID string) {
	s.teamMu.Lock()
	delete(s.teamCache, teamID)
	s.teamMu.Unlock()
}

// create is Create, without its metrics (metrics.go).
func (s *Service) create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	if req.Snapshot != "" {
		return s.createFromSnapshot(ctx, teamID, req)
	}
	key, ttl, nw, err := s.validateCreate(ctx, req)
	if err != nil {
		return client.Sandbox{}, err
	}
	tariff, named, priced, err := s.tariffOf(ctx, req.Tariff)
	if err != nil {
		return client.Sandbox{}, err
	}
	if named {
		if err := s.applyTariff(tariff, req, &key.Shape); err != nil {
			return client.Sandbox{}, err
		}
	}
	req.Tariff = ""
	if priced {
		req.Tariff = tariff.Name
	}
	if req.Secrets, err = s.resolveSecrets(ctx, teamID, req); err != nil {
		return client.Sandbox{}, err
	}
	// The template's files stay until the sandbox's row says it uses them.
	tpl, releaseTemplate, err := s.templates.Acquire(ctx, teamID, req.Template)
	if err != nil {
		if errors.Is(err, template.ErrNotFound) {
			return client.Sandbox{}, errorf(client.CodeNotFound, "template %q not found", req.Template)
		}
		return client.Sandbox{}, err
	}
	defer releaseTemplate()
	// Resolved once: the digest is what the node starts from.
	key.Template = tpl.Digest
	if key.Shape.CPU == 0 {
		key.Shape.CPU = tpl.Defaults.CPU
	}
	if key.Shape.MemoryMB == 0 {
		key.Shape.MemoryMB = tpl.Defaults.MemoryMB
	}
	if key.Shape.DiskMB == 0 {
		key.Shape.DiskMB = tpl.Defaults.DiskMB
	}
	if err := s.admitBilling(ctx, teamID, tariff, priced, key.Shape, 1); err != nil {
		return client.Sandbox{}, err
	}
	return s.admit(ctx, teamID, req, key, nw, ttl, tpl, "")
}

// admit takes the team's slot for a create and starts its sandbox (from
// snapshot, when set: key then only names the runtime and the shape the
// row records).
func (s *Service) admit(ctx context.Context, teamID string, req client.CreateSandboxRequest, key nodeapi.Spec, nw network, ttl time.Duration,
	tpl *template.Template, snapshot string) (client.Sandbox, error) {
	team, err := s.Team(ctx, teamID)
	if err != nil {
		return client.Sandbox{}, err
	}
	// Admission is in two steps, in one order: the team's slot, then the
	// host's capacity (node.Capacity, in the node). A request waits for
	// host capacity only while it holds its team slot, and a holder of
	// host capacity (a running sandbox) never waits for a slot, so no
	// cycle can form. It also keeps the host queue fair across teams:
	// a team has at most max_sandboxes requests in it, queued FIFO with
	// everyone else's. Both waits together last at most wait_seconds.
	wait := time.Duration(req.WaitSeconds) * time.Second
	deadline := time.Now().Add(wait)
	//
	// The team slot is taken twice: in this process first (FIFO among this
	// replica's waiters), then in the database (store.TakeSlot), which is
	// the authority: other replicas' sandboxes count there. A request that
	// holds its local slot but finds the team's database count full (other
	// replicas hold the rest) retries until its deadline. A database that
	// is this server's alone (Exclusive: SQLite) needs no second count:
	// the create path then spends no transaction on a slot.
	release, err := s.sandboxSlots.Acquire(ctx, teamID, team.Limits.MaxSandboxes, wait)
	var slot string // none when the database is this server's alone
	if err == nil && !s.cfg.Exclusive {
		if slot, err = s.takeSlot(ctx, teamID, deadline); err != nil {
			release()
		}
	}
	s.waited(queueSandboxSlot, deadline.Add(-wait)) // since the wait began
	if err != nil {
		if errors.Is(err, quota.ErrLimit) || errors.Is(err, store.ErrTeamLimit) {
			return client.Sandbox{}, &apierr.Error{Code: client.CodeTooManySandboxes, RetryAfter: 1, Err: err,
				Message: fmt.Sprintf("team %s has %d active sandboxes (its limit); delete one, or pass wait_seconds to queue", team.Name, team.Limits.MaxSandboxes)}
		}
		return client.Sandbox{}, err
	}
	return s.createInSlot(ctx, teamID, req, key, nw, ttl, tpl, snapshot, wait, deadline, slot, release)
}

// takeSlot takes one of the team's slots in the database, retrying with
// backoff until deadline while the team is at its limit there.
func (s *Service) takeSlot(ctx context.Context, teamID string, deadline time.Time) (string, error) {
	backoff := 20 * time.Millisecond
	for {
		slot, err := s.store.TakeSlot(ctx, teamID, s.cfg.ReplicaID, s.cfg.SlotTTL)
		if err == nil || !errors.Is(err, store.ErrTeamLimit) {
			return slot, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(min(backoff, left)):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// createInSlot starts the sandbox that holds the team's slot (slot in the
// database; localRelease gives back this process's) and records it.
func (s *Service) createInSlot(ctx context.Context, teamID string, req client.CreateSandboxRequest, key nodeapi.Spec, nw network, ttl time.Duration,
	tpl *template.Template, snapshot string, wait time.Duration, deadline time.Time, slot string, localRelease func()) (client.Sandbox, error) {
	// Until the sandbox's row replaces it, the slot is given back on
	// failure (the database's first: then this process's waiters).
	release := func() {
		if slot != "" {
			if err := s.store.ReleaseSlot(context.WithoutCancel(ctx), slot); err != nil {
				s.log.Warn("releasing a team slot", "team", teamID, "err", err)
			}
		}
		localRelease()
	}
	hostWait := time.Duration(0)
	if wait > 0 {
		hostWait = max(0, time.Until(deadline))
	}
	// The node keeps the env with the sandbox, for any replica's execs.
	creq := nodeapi.CreateRequest{Spec: key, Wait: hostWait, Env: req.Env, Secrets: req.Secrets, Egress: nw.egress}
	if snapshot != "" {
		// The node restores the snapshot's own spec.
		creq.Spec, creq.Snapshot = nodeapi.Spec{}, snapshot
	} else if s.cfg.ContentDigest != nil {
		d, err := s.cfg.ContentDigest(ctx, key.Template)
		if err != nil {
			release()
			return client.Sandbox{}, fmt.Errorf("sandbox: template %s: %w", req.Template, err)
		}
		creq.ContentDigest = d
	}
	sb, err := s.node.Create(ctx, creq)
	if err == nil && creq.Egress != nil && !sb.EgressApplied {
		// A node that predates egress rules ignores them: refuse to
		// hand out a sandbox that is open where it should be closed.
		_ = s.node.Destroy(context.WithoutCancel(ctx), sb.ID)
		err = &apierr.Error{Code: client.CodeUnavailable, RetryAfter: 1,
			Message: "the node that started the sandbox does not apply network rules (an older evalbox node); upgrade it"}
	}
	if err != nil {
		release()
		if ctx.Err() != nil {
			return client.Sandbox{}, ctx.Err()
		}
		if cerr := (*nodeapi.CapacityError)(nil); errors.As(err, &cerr) {
			s.log.Info("sandbox refused: host capacity", "team", teamID, "runtime", key.Runtime, "err", err)
			hint := "retry later, or pass wait_seconds to queue"
			switch {
			case cerr.Never && cerr.Resource == "pids":
				hint = "the server's --pids does not fit its host budget"
			case cerr.Never:
				hint = "ask for less memory_mb or disk_mb"
			}
			return client.Sandbox{}, &apierr.Error{Code: client.CodeInsufficientCapacity, RetryAfter: 1, Err: err,
				Message: fmt.Sprintf("the host has no room for this %s sandbox: %v; %s", key.Runtime, cerr, hint)}
		}
		if ae := (*apierr.Error)(nil); errors.As(err, &ae) {
			return client.Sandbox{}, err // the node's answer to the request itself
		}
		// The detail (host paths, runsc's log) is for the operator only.
		s.log.Error("sandbox failed to start", "team", teamID, "template", req.Template, "runtime", key.Runtime, "err", err)
		return client.Sandbox{}, &apierr.Error{Code: client.CodeUnavailable, RetryAfter: 1, Err: err,
			Message: fmt.Sprintf("the %s sandbox failed to start; try again (the server log has the detail)", key.Runtime)}
	}
	now := time.Now().UTC()
	envKeys := slices.Sorted(maps.Keys(req.Env))
	token, tokenHash := newTrafficToken()
	row := client.Sandbox{
		ID: sb.ID, TeamID: teamID, Template: req.Template, TemplateDigest: tpl.Digest,
		Runtime: sb.Runtime, RuntimeVersion: sb.RuntimeVersion, State: client.StateRunning,
		CPU: key.Shape.CPU, MemoryMB: key.Shape.MemoryMB, DiskMB: key.Shape.DiskMB, Network: nw.mode, NetworkRules: nw.lists,
		Ports: req.Ports, Metadata: req.Metadata, EnvKeys: envKeys,
		SecretNames: slices.Sorted(maps.Keys(req.Secrets)), Tariff: req.Tariff, CreatedAt: now, ExpiresAt: now.Add(ttl), FromPool: sb.FromPool,
		NodeID: cmp.Or(sb.Node, s.cfg.NodeID), TrafficTokenHash: tokenHash, Snapshot: snapshot,
		LongRunning: req.LongRunning,
	}
	if row.Metadata == nil {
		row.Metadata = map[string]string{}
	}
	row, err = s.store.InsertSandboxInSlot(context.WithoutCancel(ctx), row, slot)
	if err != nil {
		_ = s.node.Destroy(context.WithoutCancel(ctx), sb.ID)
		release()
		if errors.Is(err, store.ErrSlotLost) {
			s.log.Error("sandbox started after its team slot expired", "team", teamID, "sandbox", sb.ID)
			return client.Sandbox{}, &apierr.Error{Code: client.CodeUnavailable, RetryAfter: 1, Err: err,
				Message: "the sandbox's admission expired while it started; try again"}
		}
		return client.Sandbox{}, fmt.Errorf("record sandbox: %w", err)
	}
	// The running row holds the team's slot in the database now.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	e := &entry{row: row, release: localRelease, expires: row.ExpiresAt, ended: make(chan struct{}), life: watchCtx, stopWatch: stopWatch}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		s.end(ctx, e, client.StateDeleted, "server shutdown")
		return client.Sandbox{}, errorf(client.CodeUnavailable, "the server is shutting down")
	}
	adopted := s.live[sb.ID] // by a bulk delete that listed the new row meanwhile
	s.live[sb.ID] = e
	s.mu.Unlock()
	if adopted != nil {
		s.forget(adopted)
	}
	s.wg.Add(1)
	go s.watch(watchCtx, e)
	if ctx.Err() != nil {
		// The caller went away: nobody would ever delete this sandbox.
		s.end(ctx, e, client.StateDeleted, "creator disconnected")
		return client.Sandbox{}, ctx.Err()
	}
	s.log.Info("sandbox created", "sandbox", sb.ID, "team", teamID, "template", req.Template,
		"runtime", sb.Runtime, "from_pool", sb.FromPool, "env_keys", len(envKeys), "secrets", len(req.Secrets), "network", nw.mode)
	// The token is in this answer only (the row keeps its hash).
	row.TrafficToken = token
	return row, nil
}

// DefaultKey is the pool key of a create request that names only template
// (a built-in) and runtime: the sandboxes a warm pool should hold.
func (s *Service) DefaultKey(ctx context.Context, tmpl, runtime string) (nodeapi.Spec, error) {
	req := client.CreateSandboxRequest{Template: tmpl, Runtime: runtime}
	key, _, _, err := s.validateCreate(ctx, req)
	if err != nil {
		return key, err
	}
	tpl, release, err := s.templates.Acquire(ctx, "", tmpl)
	if err != nil {
		return key, err
	}
	release()
	key.Template = tpl.Digest
	key.Shape.CPU, key.Shape.MemoryMB, key.Shape.DiskMB = tpl.Defaults.CPU, tpl.Defaults.MemoryMB, tpl.Defaults.DiskMB
	return key, nil
}

// validateCreate checks a create request on its own; the template's
// defaults fill the shape's zero fields later.
func (s *Service) validateCreate(ctx context.Context, req client.CreateSandboxRequest) (nodeapi.Spec, time.Duration, network, error) {
	var key nodeapi.Spec
	if req.Template == "" {
		return key, 0, network{}, errorf(client.CodeBadRequest, "template is required")
	}
	rt := req.Runtime
	if rt == "" {
		rt = s.cfg.DefaultRuntime
	}
	runtimes, err := s.node.Runtimes(ctx)
	if err != nil {
		return key, 0, network{}, nodeErr(err)
	}
	if !slices.Contains(runtimes, rt) {
		return key, 0, network{}, errorf(client.CodeBadRequest, "runtime %q is not available (have %s)", rt, strings.Join(runtimes, ", "))
	}
	ttl, err := s.ttl(req.Timeout)
	if err != nil {
		return key, 0, network{}, err
	}
	shape := nodeapi.Shape{Pids: s.cfg.Pids, Network: client.NetworkNone}
	if req.CPU != 0 {
		if req.CPU < 0.1 || req.CPU > s.cfg.MaxCPU {
			return key, 0, network{}, errorf(client.CodeBadRequest, "cpu must be between 0.1 and %g, got %g", s.cfg.MaxCPU, req.CPU)
		}
		shape.CPU = req.CPU
	}
	if req.MemoryMB != 0 {
		if req.MemoryMB < 32 || req.MemoryMB > s.cfg.MaxMemoryMB {
			return key, 0, network{}, errorf(client.CodeBadRequest, "memory_mb must be between 32 and %d, got %d", s.cfg.MaxMemoryMB, req.MemoryMB)
		}
		shape.MemoryMB = req.MemoryMB
	}
	if req.DiskMB != 0 {
		if req.DiskMB < 16 || req.DiskMB > s.cfg.MaxDiskMB {
			return key, 0, network{}, errorf(client.CodeBadRequest, "disk_mb must be between 16 and %d, got %d", s.cfg.MaxDiskMB, req.DiskMB)
		}
		shape.DiskMB = req.DiskMB
	}
	nw, err := parseNetwork(req.Network)
	if err != nil {
		return key, 0, network{}, err
	}
	shape.Network = nw.shape
	if err := validatePorts(req.Ports); err != nil {
		return key, 0, network{}, err
	}
	if err := s.validWait(req.WaitSeconds); err != nil {
		return key, 0, network{}, err
	}
	if err := validateEnv(req.Env); err != nil {
		return key, 0, network{}, err
	}
	if err := validateSecrets(req); err != nil {
		return key, 0, network{}, err
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return key, 0, network{}, err
	}
	key = nodeapi.Spec{Template: req.Template, Runtime: rt, Shape: shape}
	return key, ttl, nw, nil
}

// validWait checks a request's wait_seconds.
func (s *Service) validWait(seconds int) error {
	if seconds < 0 || time.Duration(seconds)*time.Second > s.cfg.MaxWait {
		return errorf(client.CodeBadRequest, "wait_seconds must be between 0 and %d", int(s.cfg.MaxWait.Seconds()))
	}
	return nil
}

// ttl is the TTL of a create that asks for timeout seconds (0: the
// default).
func (s *Service) ttl(timeout int) (time.Duration, error) {
	switch {
	case timeout < 0:
		return 0, errorf(client.CodeBadRequest, "timeout must be ≥ 0 seconds, got %d", timeout)
	case time.Duration(timeout)*time.Second > s.cfg.MaxTimeout:
		return 0, errorf(client.CodeBadRequest, "timeout %ds is above the maximum %ds", timeout, int(s.cfg.MaxTimeout.Seconds()))
	case timeout > 0:
		return time.Duration(timeout) * time.Second, nil
	}
	return s.cfg.DefaultTimeout, nil
}

func validateEnv(env map[string]string) error {
	if len(env) > 256 {
		return errorf(client.CodeBadRequest, "env has %d variables, at most 256", len(env))
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || len(k) > 256 {
			return errorf(client.CodeBadRequest, "env name %q is not valid", k)
		}
		if strings.ContainsRune(v, 0) || len(v) > 32<<10 {
			return errorf(client.CodeBadRequest, "env %s: value has a NUL byte or is over 32 KiB", k)
		}
	}
	return nil
}

func validateMetadata(md map[string]string) error {
	if len(md) > 64 {
		return errorf(client.CodeBadRequest, "metadata has %d keys, at most 64", len(md))
	}
	for k, v := range md {
		if k == "" || len(k) > 128 || strings.ContainsRune(k, 0) {
			return errorf(client.CodeBadRequest, "metadata key %q is not valid (1–128 bytes)", k)
		}
		if len(v) > 1024 || strings.ContainsRune(v, 0) {
			return errorf(client.CodeBadRequest, "metadata %s: value over 1024 bytes or with a NUL byte", k)
		}
	}
	return nil
}

// reasonDied is the end reason of a sandbox whose agent went away.
const reasonDied = "sandbox stopped unexpectedly (its agent exited, was killed or ran out of memory)"

// watch ends e when its sandbox dies on its own: the node's Wait returns,
// or the node no longer knows the sandbox (it restarted). ctx ends when the
// service ends the sandbox itself. A node that cannot be asked (a remote
// one, unreachable) is asked again: that is not the sandbox's death.
func (s *Service) watch(ctx context.Context, e *entry) {
	defer s.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		end, err := s.node.Wait(ctx, e.row.ID)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, nodeapi.ErrNodeLost) {
			s.log.Warn("sandbox lost with its node", "sandbox", e.row.ID, "team", e.row.TeamID, "reason", end.Reason)
			s.endWith(context.Background(), e, client.StateLost, cmp.Or(end.Reason, err.Error()), 0)
			return
		}
		if err == nil || errors.Is(err, nodeapi.ErrSandboxNotFound) {
			s.log.Warn("sandbox died", "sandbox", e.row.ID, "team", e.row.TeamID, "reason", end.Reason, "err", err)
			s.endLost(e, end.OOMKills)
			return
		}
		s.log.Warn("watching sandbox: the node did not answer", "sandbox", e.row.ID, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// endLost ends e as lost because its agent went away; oomKills is the
// sandbox's count of OOM kills then.
func (s *Service) endLost(e *entry, oomKills int64) {
	s.endWith(context.Background(), e, client.StateLost, reasonDied, oomKills)
}

// end records e as ended, destroys it on the node and frees its slot. Only
// the first call does anything.
func (s *Service) end(ctx context.Context, e *entry, state, reason string) {
	s.endWith(ctx, e, state, reason, 0)
}

// endWith is end, told the sandbox's OOM kills when it ended lost.
func (s *Service) endWith(ctx context.Context, e *entry, state, reason string, oomKills int64) {
	e.endOnce.Do(func() {
		close(e.ended)
		e.stopWatch()
		ctx = context.WithoutCancel(ctx)
		died := state == client.StateLost && reason == reasonDied
		oom := state == client.StateLost && oomKills > 0
		if oom {
			reason = fmt.Sprintf("out of memory: the sandbox went past its memory limit (memory_mb=%d)", e.row.MemoryMB)
		}
		// The row first: a lookup that misses the live entry then reads
		// the final state.
		changed, err := s.store.MarkEnded(ctx, e.row.ID, state, reason, time.Now())
		if err != nil {
			s.log.Error("record sandbox end", "sandbox", e.row.ID, "err", err)
		}
		if changed || err != nil {
			e.died, e.oomEnded = died, oom
		}
		if changed {
			s.m.ended.WithLabelValues(state).Inc()
		}
		// Else the row had ended already: by another replica of the fleet
		// (a delete, its TTL), whose end is why the agent went away, or
		// by this one's reaper (expiredInStore).
		s.mu.Lock()
		if s.live[e.row.ID] == e {
			delete(s.live, e.row.ID)
		}
		s.mu.Unlock()
		if err := s.node.Destroy(ctx, e.row.ID); err != nil {
			s.log.Error("destroy sandbox", "sandbox", e.row.ID, "err", err)
		}
		e.release()
		s.log.Info("sandbox ended", "sandbox", e.row.ID, "team", e.row.TeamID, "state", state, "reason", reason, "recorded", changed)
	})
}

// MaxTimeout is the longest TTL a sandbox may have.
func (s *Service) MaxTimeout() time.Duration { return s.cfg.MaxTimeout }

// MaxMemoryMB is the most memory a sandbox may ask for.
func (s *Service) MaxMemoryMB() int { return s.cfg.MaxMemoryMB }

// MaxOutputLimit is the largest output cap an exec may ask for.
func (s *Service) MaxOutputLimit() int64 { return s.cfg.MaxOutputLimit }

// reaper ends sandboxes whose TTL passed.
func (s *Service) reaper() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			var expired []*entry
			if s.fleet() {
				expired = s.expiredInStore(now)
			} else {
				s.mu.Lock()
				for _, e := range s.live {
					if now.After(e.expires) {
						expired = append(expired, e)
					}
				}
				s.mu.Unlock()
			}
			s.endAll(context.Background(), expired, client.StateExpired, "timeout")
		}
	}
}

// expiry returns when e expires: in a fleet the stored expiry (another
// replica may have moved it since this one read it), else this process's.
func (s *Service) expiry(ctx context.Context, e *entry) (time.Time, error) {
	if s.fleet() {
		row, err := s.store.GetSandbox(ctx, e.row.TeamID, e.row.ID)
		if err != nil {
			return time.Time{}, err
		}
		return row.ExpiresAt, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.expires, nil
}

// expiredInStore returns the fleet's sandboxes whose TTL passed, whichever
// replica created them or last set their timeout: the store's rows are the
// authority (another replica may have moved an expiry), adopted when this
// replica does not serve them yet. Every replica reaps; of racing ends
// one records the row.
func (s *Service) expiredInStore(now time.Time) []*entry {
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.cfg.ReapInterval)
	defer cancel()
	rows, err := s.store.ListExpired(ctx, now)
	if err != nil {
		s.log.Warn("reaper: listing expired sandboxes", "err", err)
		return nil
	}
	var out []*entry
	for _, row := range rows {
		e := s.entryOf(row)
		if e == nil {
			continue
		}
		// Only if the stored expiry still has passed: a timeout another
		// replica set since the list keeps the sandbox.
		expired, err := s.store.MarkExpired(ctx, row.ID, now)
		if err != nil {
			s.log.Warn("reaper: expiring a sandbox", "sandbox", row.ID, "err", err)
			continue
		}
		if expired {
			out = append(out, e)
		}
	}
	return out
}

// lookup returns the running sandbox id of team, or the right error: a
// sandbox of another team is not_found, an ended one sandbox_not_running.
func (s *Service) lookup(ctx context.Context, teamID, id string) (*entry, error) {
	s.mu.Lock()
	e, ok := s.live[id]
	s.mu.Unlock()
	if ok && e.row.TeamID == teamID {
		return e, nil
	}
	row, err := s.store.GetSandbox(ctx, teamID, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errorf(client.CodeNotFound, "sandbox %s not found", id)
	}
	if err != nil {
		return nil, err
	}
	if row.State == client.StateRunning {
		if e := s.adopt(row); e != nil {
			return e, nil
		}
		// Not ended, and not to be reported as such (a delete must not
		// answer that it is done).
		msg := fmt.Sprintf("sandbox %s runs on node %s, which this server does not reach: call the server that created it", id, row.NodeID)
		if s.fleet() && !IsLocalNode(row.NodeID) {
			msg = fmt.Sprintf("sandbox %s runs on node %s, which is not live: its sandboxes are being ended as lost", id, row.NodeID)
		}
		return nil, &apierr.Error{Code: client.CodeUnavailable, RetryAfter: 1, Message: msg}
	}
	return nil, errorf(client.CodeSandboxNotRunning, "sandbox %s is %s (%s)", id, row.State, row.EndReason)
}

// Get returns a sandbox of the team.
func (s *Service) Get(ctx context.Context, teamID, id string) (client.Sandbox, error) {
	row, err := s.store.GetSandbox(ctx, teamID, id)
	if errors.Is(err, store.ErrNotFound) {
		return client.Sandbox{}, errorf(client.CodeNotFound, "sandbox %s not found", id)
	}
	return row, err
}

// Lookup returns a sandbox of any team: for callers whose credential is
// the sandbox's own (the E2B layer's access tokens), which check it
// against what this returns.
func (s *Service) Lookup(ctx context.Context, id string) (client.Sandbox, error) {
	row, err := s.store.GetSandboxAnyTeam(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return client.Sandbox{}, errorf(client.CodeNotFound, "sandbox %s not found", id)
	}
	return row, err
}

// List returns the team's sandboxes (running only unless all).
func (s *Service) List(ctx context.Context, teamID string, metadata map[string]string, all bool) ([]client.Sandbox, error) {
	f := store.SandboxFilter{Metadata: metadata}
	if !all {
		f.States = []string{client.StateRunning}
	}
	return s.store.ListSandboxes(ctx, teamID, f)
}

// Delete ends a sandbox of the team. Deleting an ended sandbox is a no-op;
// another team's or an unknown id is not_found.
func (s *Service) Delete(ctx context.Context, teamID, id string) error {
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		var ae *apierr.Error
		if errors.As(err, &ae) && ae.Code == client.CodeSandboxNotRunning {
			return nil
		}
		return err
	}
	s.end(ctx, e, client.StateDeleted, "deleted")
	return nil
}

// DeleteByMetadata ends every running sandbox of the team whose metadata
// matches all pairs of md (which must not be empty).
func (s *Service) DeleteByMetadata(ctx context.Context, teamID string, md map[string]string) ([]string, error) {
	if len(md) == 0 {
		return nil, errorf(client.CodeBadRequest, "bulk delete needs at least one metadata filter")
	}
	rows, err := s.List(ctx, teamID, md, false)
	if err != nil {
		return nil, err
	}
	deleted := []string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, row := range rows {
		e := s.entryOf(row)
		if e == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.end(ctx, e, client.StateDeleted, "deleted")
			mu.Lock()
			deleted = append(deleted, row.ID)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(deleted)
	return deleted, nil
}

// SetTimeout sets a running sandbox's expiry to now + timeout.
func (s *Service) SetTimeout(ctx context.Context, teamID, id string, timeout int) (client.Sandbox, error) {
	if timeout <= 0 || time.Duration(timeout)*time.Second > s.cfg.MaxTimeout {
		return client.Sandbox{}, errorf(client.CodeBadRequest, "timeout must be between 1 and %d seconds, got %d", int(s.cfg.MaxTimeout.Seconds()), timeout)
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.Sandbox{}, err
	}
	exp := time.Now().UTC().Add(time.Duration(timeout) * time.Second)
	if err := s.store.SetExpiry(ctx, teamID, id, exp); err != nil {
		if errors.Is(err, store.ErrNotRunning) {
			return client.Sandbox{}, errorf(client.CodeSandboxNotRunning, "sandbox %s is no longer running", id)
		}
		return client.Sandbox{}, err
	}
	s.mu.Lock()
	e.expires = exp
	row := e.row
	s.mu.Unlock()
	row.ExpiresAt = exp
	return row, nil
}
