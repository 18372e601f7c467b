// Package sandboxtest holds what tests of the sandbox service share.
package sandboxtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// MemStore is the sandbox service's state store (sandbox.Store) in
// memory, for the unit tests and benchmarks of the service and of what
// wraps it.
type MemStore struct {
	mu        sync.Mutex
	rows      map[string]client.Sandbox
	snapshots map[string]client.Snapshot
	// Full makes TakeSlot answer that the team is at its limit (other
	// replicas hold its slots); Slots counts the slots held.
	Full  atomic.Bool
	Slots atomic.Int64
	// ListByStateToo makes ListByState answer (else it lists nothing).
	ListByStateToo bool
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{rows: map[string]client.Sandbox{}} }

func (m *MemStore) InsertSandbox(ctx context.Context, sb client.Sandbox) (client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows[sb.ID] = sb
	return sb, nil
}

func (m *MemStore) GetSandbox(ctx context.Context, teamID, id string) (client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[id]
	if !ok || r.TeamID != teamID {
		return client.Sandbox{}, store.ErrNotFound
	}
	return r, nil
}

func (m *MemStore) ListSandboxes(ctx context.Context, teamID string, f store.SandboxFilter) ([]client.Sandbox, error) {
	return nil, nil
}

func (m *MemStore) SetExpiry(ctx context.Context, teamID, id string, t time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.rows[id]; ok && r.TeamID == teamID && r.State == client.StateRunning {
		r.ExpiresAt = t
		m.rows[id] = r
	}
	return nil
}

func (m *MemStore) MarkEnded(ctx context.Context, id, state, reason string, at time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[id]
	if !ok || r.State != client.StateRunning {
		return false, nil
	}
	r.State, r.EndReason = state, reason
	m.rows[id] = r
	return true, nil
}

func (m *MemStore) ListByState(ctx context.Context, state string) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if m.ListByStateToo && r.State == state {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *MemStore) ListRunningOn(ctx context.Context, nodeID string) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if r.NodeID == nodeID && r.State == client.StateRunning {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *MemStore) ListExpired(ctx context.Context, now time.Time) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if r.State == client.StateRunning && !r.ExpiresAt.After(now) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *MemStore) MarkExpired(ctx context.Context, id string, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[id]
	if !ok || r.State != client.StateRunning || r.ExpiresAt.After(now) {
		return false, nil
	}
	r.State, r.EndReason = client.StateExpired, "timeout"
	m.rows[id] = r
	return true, nil
}

func (m *MemStore) GetTeam(ctx context.Context, id string) (client.Team, error) {
	return client.Team{ID: id, Name: id, Limits: client.Limits{MaxSandboxes: 100, MaxConcurrentExec: 100}}, nil
}

func (m *MemStore) Row(id string) client.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rows[id]
}

func (m *MemStore) TakeSlot(ctx context.Context, teamID, replica string, ttl time.Duration) (string, error) {
	if m.Full.Load() {
		return "", fmt.Errorf("store: %w", &store.LimitError{Running: 1, Limit: 1})
	}
	m.Slots.Add(1)
	return store.NewID("slot"), nil
}

func (m *MemStore) ReleaseSlot(ctx context.Context, id string) error { m.Slots.Add(-1); return nil }
func (m *MemStore) RenewSlots(ctx context.Context, replica string, ttl time.Duration) error {
	return nil
}

func (m *MemStore) InsertSandboxInSlot(ctx context.Context, sb client.Sandbox, slotID string) (client.Sandbox, error) {
	if slotID != "" {
		m.Slots.Add(-1)
	}
	return m.InsertSandbox(ctx, sb)
}

func (m *MemStore) ListRunningOnNode(ctx context.Context, nodeID string) ([]client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []client.Sandbox
	for _, r := range m.rows {
		if (r.NodeID == nodeID || r.NodeID == "") && r.State == client.StateRunning {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *MemStore) GetSandboxAnyTeam(ctx context.Context, id string) (client.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.rows[id]; ok {
		return r, nil
	}
	return client.Sandbox{}, store.ErrNotFound
}

func (m *MemStore) update(teamID, id string, f func(*client.Sandbox)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[id]
	if !ok || r.TeamID != teamID {
		return store.ErrNotFound
	}
	if r.State != client.StateRunning {
		return store.ErrNotRunning
	}
	f(&r)
	m.rows[id] = r
	return nil
}

func (m *MemStore) SetNetwork(ctx context.Context, teamID, id, mode string, rules *client.NetworkRuleLists) error {
	return m.update(teamID, id, func(r *client.Sandbox) { r.Network, r.NetworkRules = mode, rules })
}

func (m *MemStore) SetPorts(ctx context.Context, teamID, id string, ports []client.PortSpec) error {
	return m.update(teamID, id, func(r *client.Sandbox) { r.Ports = ports })
}

func (m *MemStore) SetTrafficTokenHash(ctx context.Context, teamID, id, hash string) error {
	return m.update(teamID, id, func(r *client.Sandbox) { r.TrafficTokenHash = hash })
}

// SetPaused records a pause (at) or a resume (nil).
func (m *MemStore) SetPaused(ctx context.Context, teamID, id string, at *time.Time) error {
	return m.update(teamID, id, func(r *client.Sandbox) { r.PausedAt = at })
}

// SetCPUAbuseWarned records the CPU-abuse rule's warning of a running
// sandbox.
func (m *MemStore) SetCPUAbuseWarned(ctx context.Context, id string, at time.Time) error {
	return m.update(m.Row(id).TeamID, id, func(r *client.Sandbox) { r.CPUAbuseWarnedAt = &at })
}

// SetCPUThrottled records the CPU-abuse rule's throttle of a running
// sandbox.
func (m *MemStore) SetCPUThrottled(ctx context.Context, id string, at time.Time) error {
	return m.update(m.Row(id).TeamID, id, func(r *client.Sandbox) { r.CPUThrottledAt = &at })
}

// InsertSnapshot stores a snapshot row.
func (m *MemStore) InsertSnapshot(ctx context.Context, sn client.Snapshot) (client.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.snapshots == nil {
		m.snapshots = map[string]client.Snapshot{}
	}
	if _, ok := m.snapshots[sn.ID]; ok {
		return client.Snapshot{}, store.ErrConflict
	}
	m.snapshots[sn.ID] = sn
	return sn, nil
}

// GetSnapshot returns the team's snapshot.
func (m *MemStore) GetSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sn, ok := m.snapshots[id]
	if !ok || sn.TeamID != teamID {
		return client.Snapshot{}, store.ErrNotFound
	}
	return sn, nil
}

// ListSnapshots returns the team's snapshots.
func (m *MemStore) ListSnapshots(ctx context.Context, teamID string) ([]client.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []client.Snapshot{}
	for _, sn := range m.snapshots {
		if sn.TeamID == teamID {
			out = append(out, sn)
		}
	}
	return out, nil
}

// DeleteSnapshot removes the team's snapshot.
func (m *MemStore) DeleteSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sn, ok := m.snapshots[id]
	if !ok || sn.TeamID != teamID {
		return client.Snapshot{}, store.ErrNotFound
	}
	delete(m.snapshots, id)
	return sn, nil
}
