package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/sandbox/sandboxtest"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeNode is a nodeapi.Node whose sandboxes are entries in a map; Wait
// returns what the test sends on a sandbox's channel. Methods the tests
// do not use are those of the nil interface it embeds.
type fakeNode struct {
	nodeapi.Node
	mu        sync.Mutex
	n         int
	creates   []nodeapi.CreateRequest
	ends      map[string]chan waitResult
	destroyed map[string]bool
	createErr error
	execErr   error
	execs     []nodeapi.ExecRequest
	waitErrs  int // Waits that fail with ErrNodeUnreachable before one blocks
	// ignoresEgress makes it a node that predates egress rules.
	ignoresEgress bool
}

type waitResult struct {
	end nodeapi.End
	err error
}

func newFakeNode() *fakeNode {
	return &fakeNode{ends: map[string]chan waitResult{}, destroyed: map[string]bool{}}
}

func (f *fakeNode) Runtimes(context.Context) ([]string, error) { return []string{"fake"}, nil }

func (f *fakeNode) Create(ctx context.Context, req nodeapi.CreateRequest) (nodeapi.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, req)
	if f.createErr != nil {
		return nodeapi.SandboxInfo{}, f.createErr
	}
	f.n++
	id := fmt.Sprintf("sb-%d", f.n)
	f.ends[id] = make(chan waitResult, 1)
	return nodeapi.SandboxInfo{ID: id, Runtime: req.Spec.Runtime, RuntimeVersion: "fake/1", StartedAt: time.Now(),
		EgressApplied: req.Egress != nil && !f.ignoresEgress}, nil
}

func (f *fakeNode) Destroy(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed[id] = true
	return nil
}

func (f *fakeNode) Wait(ctx context.Context, id string) (nodeapi.End, error) {
	f.mu.Lock()
	ch := f.ends[id]
	fail := f.waitErrs > 0
	if fail {
		f.waitErrs--
	}
	f.mu.Unlock()
	if fail {
		return nodeapi.End{}, fmt.Errorf("grpcnode wait: %w: connection refused", nodeapi.ErrNodeUnreachable)
	}
	select {
	case <-ctx.Done():
		return nodeapi.End{}, ctx.Err()
	case r := <-ch:
		return r.end, r.err
	}
}

func (f *fakeNode) Exec(ctx context.Context, id string, req nodeapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (nodeapi.ExitInfo, error) {
	if f.execErr != nil {
		return nodeapi.ExitInfo{}, f.execErr
	}
	f.mu.Lock()
	f.execs = append(f.execs, req)
	f.mu.Unlock()
	return nodeapi.ExitInfo{Status: nodeapi.StatusExited}, nil
}

// die makes sandbox id end as the node would report it.
func (f *fakeNode) die(id string, r waitResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ends[id] <- r
}

func (f *fakeNode) isDestroyed(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.destroyed[id]
}

type fakeTemplates struct{}

var fakeTemplate = &template.Template{Name: "base", Digest: "sha256:" + strings.Repeat("5", 64), Source: template.SourceBuiltin,
	Defaults: template.Defaults{CPU: 1, MemoryMB: 256, DiskMB: 64}}

func (fakeTemplates) Acquire(ctx context.Context, teamID, name string) (*template.Template, func(), error) {
	if name != "base" {
		return nil, nil, template.ErrNotFound
	}
	return fakeTemplate, func() {}, nil
}

func newTestService(t *testing.T, n nodeapi.Node) (*Service, *sandboxtest.MemStore) {
	t.Helper()
	st := sandboxtest.NewMemStore()
	svc := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour}, st, n, fakeTemplates{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { svc.Close(context.Background()) })
	return svc, st
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCreateSendsTheDigest: the catalog resolves the name once; the node
// gets the digest, the shape with the template's defaults, and the wait.
func TestCreateSendsTheDigest(t *testing.T) {
	f := newFakeNode()
	svc, _ := newTestService(t, f)
	if _, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base", MemoryMB: 128, WaitSeconds: 5}); err != nil {
		t.Fatal(err)
	}
	req := f.creates[0]
	if req.Spec.Template != fakeTemplate.Digest || req.Spec.Runtime != "fake" || req.Spec.Shape.MemoryMB != 128 ||
		req.Spec.Shape.CPU != 1 || req.Spec.Shape.DiskMB != 64 || req.Wait <= 0 || req.Wait > 5*time.Second {
		t.Errorf("create request %+v", req)
	}
	if _, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "nope"}); apierr.Code(err) != client.CodeNotFound {
		t.Errorf("unknown template: %v", err)
	}
}

// TestDeathIsObserved: a sandbox whose Wait returns is recorded lost,
// destroyed, and its team slot freed; OOM kills say it ran out of memory;
// a node that no longer knows it means it is lost too.
func TestDeathIsObserved(t *testing.T) {
	f := newFakeNode()
	svc, st := newTestService(t, f)
	for _, tc := range []struct {
		r      waitResult
		reason string
	}{
		{waitResult{end: nodeapi.End{Reason: "agent went away"}}, reasonDied},
		{waitResult{end: nodeapi.End{OOMKills: 2}}, "out of memory"},
		{waitResult{err: fmt.Errorf("x: %w", nodeapi.ErrSandboxNotFound)}, reasonDied},
	} {
		sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		f.die(sb.ID, tc.r)
		waitFor(t, "the sandbox lost", func() bool { return st.Row(sb.ID).State == client.StateLost })
		if r := st.Row(sb.ID); !strings.Contains(r.EndReason, tc.reason) {
			t.Errorf("%+v: reason %q, want %q", tc.r, r.EndReason, tc.reason)
		}
		waitFor(t, "the sandbox destroyed", func() bool { return f.isDestroyed(sb.ID) })
		if _, err := svc.Exec(t.Context(), "team", sb.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil); apierr.Code(err) != client.CodeSandboxNotRunning {
			t.Errorf("exec in a lost sandbox: %v", err)
		}
	}
}

// TestWatchRetriesAnUnreachableNode: a node that cannot be asked is asked
// again; the sandbox keeps running. Deleting it ends the watch.
func TestWatchRetriesAnUnreachableNode(t *testing.T) {
	f := newFakeNode()
	f.waitErrs = 3
	svc, st := newTestService(t, f)
	sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retries", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.waitErrs == 0 })
	time.Sleep(50 * time.Millisecond)
	if r := st.Row(sb.ID); r.State != client.StateRunning {
		t.Fatalf("an unreachable node ended the sandbox: %+v", r)
	}
	if err := svc.Delete(t.Context(), "team", sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := st.Row(sb.ID); r.State != client.StateDeleted || !f.isDestroyed(sb.ID) {
		t.Errorf("after delete: %+v", r)
	}
}

// TestCallErrors: the node's errors keep their meaning for the API.
func TestCallErrors(t *testing.T) {
	f := newFakeNode()
	svc, st := newTestService(t, f)
	exec := func(id string) error {
		_, err := svc.Exec(t.Context(), "team", id, client.ExecRequest{Argv: []string{"true"}}, nil, nil)
		return err
	}
	create := func() string {
		sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID
	}

	id := create()
	f.execErr = &nodeapi.AgentError{Code: nodeapi.CodeNotFound, Message: "no such file"}
	if err := exec(id); apierr.Code(err) != client.CodeNotFound {
		t.Errorf("agent not found: %v", err)
	}
	f.execErr = fmt.Errorf("grpcnode exec: %w: reset", nodeapi.ErrNodeUnreachable)
	if err := exec(id); apierr.Code(err) != client.CodeUnavailable || st.Row(id).State != client.StateRunning {
		t.Errorf("unreachable node: %v, %s", err, st.Row(id).State)
	}
	f.execErr = &nodeapi.StoppedError{ID: id}
	if err := exec(id); apierr.Code(err) != client.CodeSandboxNotRunning || !errors.Is(err, apierr.ErrStoppedDuringCall) || st.Row(id).State != client.StateLost {
		t.Errorf("stopped during the call: %v, %s", err, st.Row(id).State)
	}
	id = create()
	f.execErr = &nodeapi.StoppedError{ID: id, OOMKills: 1}
	if err := exec(id); !errors.Is(err, apierr.ErrOutOfMemory) || !strings.Contains(st.Row(id).EndReason, "out of memory") {
		t.Errorf("out of memory during the call: %v, %q", err, st.Row(id).EndReason)
	}

	f.createErr = &nodeapi.CapacityError{Resource: "pids", Need: 10, Reserved: 5, Budget: 10}
	_, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
	if ae := (*apierr.Error)(nil); !errors.As(err, &ae) || ae.Code != client.CodeInsufficientCapacity || ae.RetryAfter == 0 {
		t.Errorf("capacity: %v", err)
	}
	f.createErr = &nodeapi.TemplateMissingError{Digest: fakeTemplate.Digest}
	if _, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"}); apierr.Code(err) != client.CodeUnavailable {
		t.Errorf("template missing on the node: %v", err)
	}
}

// procNode adds background processes whose WaitProcess fails as an
// unreachable node would, a few times, then blocks until the sandbox's
// call ends.
type procNode struct {
	*fakeNode
	waits atomic.Int64
	fails int64
}

func (p *procNode) StartProcess(ctx context.Context, id string, req nodeapi.ExecRequest) (nodeapi.ProcInfo, error) {
	return nodeapi.ProcInfo{ID: "p-1", Pid: 7, Running: true}, nil
}

func (p *procNode) WaitProcess(ctx context.Context, id, procID string) (nodeapi.ExitInfo, error) {
	if p.waits.Add(1) <= p.fails {
		return nodeapi.ExitInfo{}, fmt.Errorf("grpcnode wait_process: %w", nodeapi.ErrNodeUnreachable)
	}
	return nodeapi.ExitInfo{}, &nodeapi.StoppedError{ID: id}
}

// TestBackgroundSlotThroughAnUnreachableNode: the wait that holds a
// background process's exec slot is asked again while the node cannot be
// reached.
func TestBackgroundSlotThroughAnUnreachableNode(t *testing.T) {
	p := &procNode{fakeNode: newFakeNode(), fails: 3}
	svc, _ := newTestService(t, p)
	sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.StartProcess(t.Context(), "team", sb.ID, client.ExecRequest{Argv: []string{"sleep", "9"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waits", func() bool { return p.waits.Load() == 4 })
}

// TestCreateWaitsForTheDatabaseSlot: the database is the authority on a
// team's limit. A create this replica would admit, but whose team the
// database finds full (other replicas' sandboxes), is refused at once
// without wait_seconds, retried until its deadline with it, and admitted
// once the database has room; a refused create gives its local slot back.
func TestCreateWaitsForTheDatabaseSlot(t *testing.T) {
	f := newFakeNode()
	svc, st := newTestService(t, f)
	st.Full.Store(true)
	_, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
	if apierr.Code(err) != client.CodeTooManySandboxes {
		t.Fatalf("database full, no wait: %v", err)
	}
	start := time.Now()
	_, err = svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base", WaitSeconds: 1})
	if apierr.Code(err) != client.CodeTooManySandboxes || time.Since(start) < time.Second {
		t.Fatalf("database full, 1 s wait: %v after %v", err, time.Since(start))
	}
	if n := svc.sandboxSlots.InUse("team"); n != 0 {
		t.Fatalf("%d local slots held after refusals", n)
	}
	time.AfterFunc(300*time.Millisecond, func() { st.Full.Store(false) })
	start = time.Now()
	sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base", WaitSeconds: 10})
	if err != nil || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("admitted once the database had room: %v after %v", err, time.Since(start))
	}
	if n := st.Slots.Load(); n != 0 {
		t.Errorf("%d database slots held once the row exists", n)
	}
	if err := svc.Delete(t.Context(), "team", sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestNodeLost: a sandbox whose node is lost ends lost with the node's
// reason, its team slot free again; a call on it fails with
// apierr.ErrNodeLost, never ErrStoppedDuringCall; draining the node marks
// rows no one here runs.
func TestNodeLost(t *testing.T) {
	f := newFakeNode()
	st := sandboxtest.NewMemStore()
	svc := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour, NodeID: "n1"}, st, f, fakeTemplates{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { svc.Close(context.Background()) })
	svc.teamCache["team"] = cachedTeam{team: client.Team{ID: "team", Limits: client.Limits{MaxSandboxes: 1, MaxConcurrentExec: 4}}, at: time.Now().Add(time.Hour)}
	create := func() string {
		sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		if sb.NodeID != "n1" {
			t.Fatalf("row's node %q, want n1", sb.NodeID)
		}
		return sb.ID
	}
	lost := &nodeapi.NodeLostError{NodeID: "n1", Why: "its lease expired"}

	// Through the watch: Wait returns the node's end.
	id := create()
	f.die(id, waitResult{end: nodeapi.End{Reason: lost.Error()}, err: lost})
	waitFor(t, "the sandbox lost", func() bool { return st.Row(id).State == client.StateLost })
	if r := st.Row(id); r.EndReason != "node n1 lost (its lease expired)" {
		t.Errorf("reason %q", r.EndReason)
	}
	// Its slot is free: the team's one sandbox can be created again.
	id = create()

	// Through a call in flight.
	f.execErr = lost
	_, err := svc.Exec(t.Context(), "team", id, client.ExecRequest{Argv: []string{"true"}}, nil, nil)
	if !errors.Is(err, apierr.ErrNodeLost) || errors.Is(err, apierr.ErrStoppedDuringCall) || apierr.Code(err) != client.CodeSandboxNotRunning {
		t.Errorf("call on a lost node: %v", err)
	}
	if r := st.Row(id); r.State != client.StateLost || r.EndReason != lost.Error() {
		t.Errorf("after the call: %+v", r)
	}
	f.execErr = nil

	// Draining: this service's sandboxes and rows of others (another
	// replica's) on the node; other nodes' stay.
	id = create()
	other, _ := st.InsertSandbox(t.Context(), client.Sandbox{ID: "sb-other", TeamID: "t2", State: client.StateRunning, NodeID: "n1"})
	elsewhere, _ := st.InsertSandbox(t.Context(), client.Sandbox{ID: "sb-n2", TeamID: "t2", State: client.StateRunning, NodeID: "n2"})
	if err := svc.NodeLost(t.Context(), "n1", lost.Error()); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{id, other.ID} {
		if row := st.Row(r); row.State != client.StateLost || row.EndReason != lost.Error() {
			t.Errorf("%s after the drain: %+v", r, row)
		}
	}
	if row := st.Row(elsewhere.ID); row.State != client.StateRunning {
		t.Errorf("another node's row after the drain: %+v", row)
	}
	create()
}

// TestRecoverInAFleet: at start, running rows of nodes that are not live
// are lost; those of live nodes are watched from then on (one that died
// while no replica watched ends lost); an embedded server's rows on a
// shared database are left alone.
func TestRecoverInAFleet(t *testing.T) {
	st := sandboxtest.NewMemStore()
	local := LocalNodeID("host", "inst")
	for _, r := range []client.Sandbox{{ID: "a", NodeID: "live"}, {ID: "b", NodeID: "dead"}, {ID: "c", NodeID: local}, {ID: "d", NodeID: "live"}} {
		r.TeamID, r.State = "team", client.StateRunning
		if _, err := st.InsertSandbox(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	st.ListByStateToo = true
	f := newFakeNode()
	f.ends["a"], f.ends["d"] = make(chan waitResult, 1), make(chan waitResult, 1)
	svc := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour, NodeLive: func(id string) bool { return id == "live" }},
		st, f, fakeTemplates{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { svc.Close(context.Background()) })
	if err := svc.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r := st.Row("a"); r.State != client.StateRunning {
		t.Errorf("a live node's row: %+v", r)
	}
	if r := st.Row("b"); r.State != client.StateLost || r.EndReason != "node dead lost (it is not live)" {
		t.Errorf("a dead node's row: %+v", r)
	}
	if r := st.Row("c"); r.State != client.StateRunning {
		t.Errorf("an embedded server's row: %+v", r)
	}
	// d's sandbox is gone from its node (it restarted while no replica
	// ran): the watch Recover started notices.
	f.die("d", waitResult{err: nodeapi.ErrSandboxNotFound})
	waitFor(t, "d lost", func() bool { return st.Row("d").State == client.StateLost })
	if r := st.Row("a"); r.State != client.StateRunning {
		t.Errorf("a live node's row after another's death: %+v", r)
	}
}

// TestFleetCloseLeavesProcesses: a fleet replica that shuts down leaves
// its sandboxes running with their background processes, and does not
// wait for those to end.
func TestFleetCloseLeavesProcesses(t *testing.T) {
	p := &blockingProcNode{fakeNode: newFakeNode()}
	st := sandboxtest.NewMemStore()
	svc := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour, NodeID: "n1", NodeLive: func(string) bool { return true }},
		st, p, fakeTemplates{}, slog.New(slog.DiscardHandler))
	sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.StartProcess(t.Context(), "team", sb.ID, client.ExecRequest{Argv: []string{"sleep", "infinity"}}); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- svc.Close(context.Background()) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close waits for a background process of a sandbox it leaves running")
	}
	if r := st.Row(sb.ID); r.State != client.StateRunning || p.isDestroyed(sb.ID) {
		t.Errorf("after Close: %+v, destroyed %v", r, p.isDestroyed(sb.ID))
	}
}

// blockingProcNode's background processes run until their wait's context
// ends.
type blockingProcNode struct{ *fakeNode }

func (p *blockingProcNode) StartProcess(ctx context.Context, id string, req nodeapi.ExecRequest) (nodeapi.ProcInfo, error) {
	return nodeapi.ProcInfo{ID: "p-1", Pid: 7, Running: true}, nil
}

func (p *blockingProcNode) WaitProcess(ctx context.Context, id, procID string) (nodeapi.ExitInfo, error) {
	<-ctx.Done()
	return nodeapi.ExitInfo{}, ctx.Err()
}

// TestEndedElsewhere: a call on a sandbox another replica ended (its node
// no longer knows it) fails as ended while the call ran, never as stopped
// by its own code; the row keeps the other replica's end.
func TestEndedElsewhere(t *testing.T) {
	f := newFakeNode()
	st := sandboxtest.NewMemStore()
	svc := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour, NodeID: "n1", NodeLive: func(string) bool { return true }},
		st, f, fakeTemplates{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { svc.Close(context.Background()) })
	sb, err := svc.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.MarkEnded(t.Context(), sb.ID, client.StateDeleted, "deleted", time.Now()); err != nil {
		t.Fatal(err)
	}
	f.execErr = fmt.Errorf("grpcnode exec: %w", nodeapi.ErrSandboxNotFound)
	_, err = svc.Exec(t.Context(), "team", sb.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil)
	if errors.Is(err, apierr.ErrStoppedDuringCall) || apierr.Code(err) != client.CodeSandboxNotRunning || !strings.Contains(err.Error(), "was ended while the call ran") {
		t.Errorf("a call on a sandbox ended elsewhere: %v", err)
	}
	if r := st.Row(sb.ID); r.State != client.StateDeleted || r.EndReason != "deleted" {
		t.Errorf("row after: %+v", r)
	}
}

// TestReplicasShareFleetSandboxes: two replicas of a fleet (one store,
// one set of nodes). A sandbox one creates, the other serves: its env is
// the node's (sent at create, not again with each exec); a timeout set
// through one is the one the other's reaper ends it at; a delete through
// either ends it once. A replica that shuts down leaves its sandboxes
// running on their nodes. An embedded server on the same store cannot
// reach a fleet node's sandbox, and says so.
func TestReplicasShareFleetSandboxes(t *testing.T) {
	f := newFakeNode()
	st := sandboxtest.NewMemStore()
	team := client.Team{ID: "team", Limits: client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 8}}
	replica := func(reap time.Duration) *Service {
		svc := New(Config{DefaultRuntime: "fake", ReapInterval: reap, NodeID: "n1", NodeLive: func(id string) bool { return id == "n1" }},
			st, f, fakeTemplates{}, slog.New(slog.DiscardHandler))
		svc.teamCache["team"] = cachedTeam{team: team, at: time.Now().Add(time.Hour)}
		return svc
	}
	a, b := replica(20*time.Millisecond), replica(time.Hour)
	t.Cleanup(func() { b.Close(context.Background()) })
	create := func() client.Sandbox {
		sb, err := a.Create(t.Context(), "team", client.CreateSandboxRequest{Template: "base", Env: map[string]string{"SECRET": "s3"}, Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	sb := create()
	if env := f.creates[0].Env; env["SECRET"] != "s3" {
		t.Fatalf("the create's env did not reach the node: %v", env)
	}
	if _, err := b.Exec(t.Context(), "team", sb.ID, client.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"X": "1"}}, nil, nil); err != nil {
		t.Fatalf("exec through the other replica: %v", err)
	}
	f.mu.Lock()
	env := f.execs[len(f.execs)-1].Env
	f.mu.Unlock()
	if len(env) != 1 || env["X"] != "1" {
		t.Errorf("exec env %v: want only the exec's own (the node adds the sandbox's)", env)
	}
	if _, err := b.Exec(t.Context(), "other-team", sb.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil); apierr.Code(err) != client.CodeNotFound {
		t.Errorf("another team through the other replica: %v", err)
	}

	// b sets a 1 s timeout; a's reaper (its own copy of the expiry is 600 s
	// away) ends the sandbox at the stored one.
	if _, err := b.SetTimeout(t.Context(), "team", sb.ID, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sandbox expired", func() bool { return st.Row(sb.ID).State == client.StateExpired })
	waitFor(t, "the sandbox destroyed", func() bool { return f.isDestroyed(sb.ID) })

	// A delete through b of a's sandbox.
	sb2 := create()
	if err := b.Delete(t.Context(), "team", sb2.ID); err != nil {
		t.Fatal(err)
	}
	if r := st.Row(sb2.ID); r.State != client.StateDeleted || !f.isDestroyed(sb2.ID) {
		t.Errorf("deleted through the other replica: %+v, destroyed %v", r, f.isDestroyed(sb2.ID))
	}

	// a shuts down: its sandbox runs on, and b serves it.
	sb3 := create()
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := st.Row(sb3.ID); r.State != client.StateRunning || f.isDestroyed(sb3.ID) {
		t.Errorf("a fleet sandbox after its replica shut down: %+v, destroyed %v", r, f.isDestroyed(sb3.ID))
	}
	if _, err := b.Exec(t.Context(), "team", sb3.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
		t.Errorf("exec after the creating replica shut down: %v", err)
	}

	// An embedded server sharing the store does not reach node n1.
	emb := New(Config{DefaultRuntime: "fake", ReapInterval: time.Hour, NodeID: "local:h:1"}, st, newFakeNode(), fakeTemplates{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { emb.Close(context.Background()) })
	emb.teamCache["team"] = cachedTeam{team: team, at: time.Now().Add(time.Hour)}
	_, err := emb.Exec(t.Context(), "team", sb3.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil)
	if apierr.Code(err) != client.CodeUnavailable || !strings.Contains(err.Error(), "does not reach") {
		t.Errorf("exec from an embedded server: %v", err)
	}
	// Nor does it pretend to have deleted it.
	if err := emb.Delete(t.Context(), "team", sb3.ID); apierr.Code(err) != client.CodeUnavailable {
		t.Errorf("delete from an embedded server: %v", err)
	}
	if r := st.Row(sb3.ID); r.State != client.StateRunning {
		t.Errorf("after the embedded server's delete: %+v", r)
	}
	if err := b.Delete(t.Context(), "team", sb3.ID); err != nil {
		t.Fatal(err)
	}
}
