package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/quota"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// Snapshots, forks, pause and resume (docs/design/snapshots.md). A
// snapshot's files are on the node that took it; its row (the team's)
// says where, and keeps its template's files in use. A paused sandbox is
// running in the records (it keeps its team slot and its TTL) with
// paused_at set.

// Snapshot snapshots the team's running sandbox. The sandbox goes on; its
// calls in flight fail with a conflict (try again), calls made meanwhile
// wait. Its bytes count against the team's storage limit: a snapshot that
// would pass it is removed again (413 storage_quota_exceeded).
func (s *Service) Snapshot(ctx context.Context, teamID, id string) (client.Snapshot, error) {
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.Snapshot{}, err
	}
	// The network as it is now (the store's row: an update changes it,
	// not the entry's), held while the snapshot is taken, so that its
	// copies get the rules its processes ran under.
	e.netMu.Lock()
	defer e.netMu.Unlock()
	row, err := s.store.GetSandbox(ctx, teamID, id)
	if err != nil {
		return client.Snapshot{}, err
	}
	if row.State != client.StateRunning {
		return client.Snapshot{}, errorf(client.CodeSandboxNotRunning, "sandbox %s is %s", id, row.State)
	}
	if row.PausedAt != nil {
		return client.Snapshot{}, errorf(client.CodeSandboxNotRunning, "sandbox %s is paused: resume it first", id)
	}
	// Nothing is taken once the team is over its limit already.
	res, err := s.cfg.Storage.Reserve(ctx, teamID, 0)
	if err != nil {
		return client.Snapshot{}, storageErr(err)
	}
	defer res.Release()
	// The node's outcome is what is recorded: a caller that goes away
	// meanwhile leaves no image without a row.
	nctx, cancel := nodeCallContext(ctx, 0)
	defer cancel()
	info, err := s.node.Snapshot(nctx, id)
	if err != nil {
		return client.Snapshot{}, nodeErr(err)
	}
	sn := client.Snapshot{ID: info.ID, TeamID: teamID, SandboxID: id, Template: row.Template, TemplateDigest: row.TemplateDigest,
		Runtime: row.Runtime, RuntimeVersion: info.RuntimeVersion, CPU: row.CPU, MemoryMB: row.MemoryMB, DiskMB: row.DiskMB,
		Network: row.Network, NetworkRules: row.NetworkRules, Memory: info.Memory, SizeBytes: info.SizeBytes,
		CreatedAt: info.CreatedAt, NodeID: row.NodeID}
	err = res.Persist(sn.SizeBytes, func() error {
		var err error
		sn, err = s.store.InsertSnapshot(context.WithoutCancel(ctx), sn)
		return err
	})
	if err != nil {
		if derr := s.node.DeleteSnapshot(context.WithoutCancel(ctx), info.ID); derr != nil {
			s.log.Error("removing a snapshot that was not recorded", "snapshot", info.ID, "err", derr)
		}
		return client.Snapshot{}, storageErr(err)
	}
	s.log.Info("snapshot taken", "sandbox", id, "team", teamID, "snapshot", sn.ID, "size_bytes", sn.SizeBytes, "memory", sn.Memory)
	return sn, nil
}

// storageErr maps a storage quota error to its API error.
func storageErr(err error) error {
	var se *quota.StorageError
	if errors.As(err, &se) {
		return &apierr.Error{Code: client.CodeStorageQuotaExceeded, Err: err,
			Message: fmt.Sprintf("%v (templates, snapshots, eval inputs); delete snapshots or templates, or ask an admin to raise the team's max_storage_mb", se)}
	}
	return err
}

// GetSnapshot returns the team's snapshot.
func (s *Service) GetSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error) {
	sn, err := s.store.GetSnapshot(ctx, teamID, id)
	if errors.Is(err, store.ErrNotFound) {
		return client.Snapshot{}, errorf(client.CodeNotFound, "snapshot %s not found", id)
	}
	return sn, err
}

// ListSnapshots returns the team's snapshots, newest first.
func (s *Service) ListSnapshots(ctx context.Context, teamID string) ([]client.Snapshot, error) {
	return s.store.ListSnapshots(ctx, teamID)
}

// DeleteSnapshot removes the team's snapshot: its row, then its files on
// its node (sandboxes restored from it go on). A node that cannot be
// reached leaves its files to the node's sweep.
func (s *Service) DeleteSnapshot(ctx context.Context, teamID, id string) error {
	if _, err := s.GetSnapshot(ctx, teamID, id); err != nil {
		return err
	}
	// Its files first, while the row still says where they are (a fleet
	// finds the node by it); a node that is gone took them with it.
	nctx, cancel := nodeCallContext(ctx, 0)
	defer cancel()
	if err := s.node.DeleteSnapshot(nctx, id); err != nil {
		return nodeErr(err)
	}
	if _, err := s.store.DeleteSnapshot(context.WithoutCancel(ctx), teamID, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return nil
}

// nodeCallContext is the context of a node call whose outcome the
// service must learn to keep its records true (a snapshot, a pause, a
// resume): not ended by its caller going away, bounded by the node's
// own work (and wait, a resume's queueing).
func nodeCallContext(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute+wait)
}

// createFromSnapshot is Create of a sandbox restored from the team's
// snapshot req.Snapshot.
func (s *Service) createFromSnapshot(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	if req.Template != "" || req.Runtime != "" || req.CPU != 0 || req.MemoryMB != 0 || req.DiskMB != 0 || !req.Network.IsZero() {
		return client.Sandbox{}, errorf(client.CodeBadRequest,
			"a sandbox restored from a snapshot has the snapshot's template, runtime, cpu, memory_mb, disk_mb and network: leave them unset")
	}
	sn, err := s.GetSnapshot(ctx, teamID, req.Snapshot)
	if err != nil {
		return client.Sandbox{}, err
	}
	ttl, err := s.ttl(req.Timeout)
	if err != nil {
		return client.Sandbox{}, err
	}
	if err := validateEnv(req.Env); err != nil {
		return client.Sandbox{}, err
	}
	if err := validateSecrets(req); err != nil {
		return client.Sandbox{}, err
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return client.Sandbox{}, err
	}
	if err := validatePorts(req.Ports); err != nil {
		return client.Sandbox{}, err
	}
	if err := s.validWait(req.WaitSeconds); err != nil {
		return client.Sandbox{}, err
	}
	// A snapshot keeps no secrets: the restored sandbox has the ones
	// given here.
	if req.Secrets, err = s.resolveSecrets(ctx, teamID, req); err != nil {
		return client.Sandbox{}, err
	}
	// A tariff prices it; the snapshot's shape must fit a named one.
	tariff, named, priced, err := s.tariffOf(ctx, req.Tariff)
	if err != nil {
		return client.Sandbox{}, err
	}
	if named && (sn.CPU > tariff.CPU || sn.MemoryMB > tariff.MemoryMB || sn.DiskMB > tariff.DiskMB) {
		return client.Sandbox{}, errorf(client.CodeBadRequest, "snapshot %s (%g vCPU, %d MB, %d MB disk) does not fit tariff %s (%g, %d, %d)",
			sn.ID, sn.CPU, sn.MemoryMB, sn.DiskMB, tariff.Name, tariff.CPU, tariff.MemoryMB, tariff.DiskMB)
	}
	req.Tariff = ""
	if priced {
		req.Tariff = tariff.Name
	}
	if err := s.admitBilling(ctx, teamID, tariff, priced, nodeapi.Shape{CPU: sn.CPU, MemoryMB: sn.MemoryMB, DiskMB: sn.DiskMB}, 1); err != nil {
		return client.Sandbox{}, err
	}
	nw := network{mode: sn.Network, lists: sn.NetworkRules}
	if sn.NetworkRules != nil {
		nw.egress = &nodeapi.Egress{Allow: sn.NetworkRules.Allow, Deny: sn.NetworkRules.Deny}
	}
	req.Template = sn.Template
	// The node has the snapshot's spec; the row records the shape.
	key := nodeapi.Spec{Runtime: sn.Runtime, Shape: nodeapi.Shape{CPU: sn.CPU, MemoryMB: sn.MemoryMB, DiskMB: sn.DiskMB}}
	return s.admit(ctx, teamID, req, key, nw, ttl, &template.Template{Digest: sn.TemplateDigest}, sn.ID)
}

// Fork snapshots the team's running sandbox once and makes req.Count
// sandboxes from it, all or none: when one fails, the others are deleted.
// The snapshot is deleted after unless req.KeepSnapshot.
func (s *Service) Fork(ctx context.Context, teamID, id string, req client.ForkRequest) (client.ForkResult, error) {
	if req.Count < 1 || req.Count > client.MaxForkCount {
		return client.ForkResult{}, errorf(client.CodeBadRequest, "count must be between 1 and %d, got %d", client.MaxForkCount, req.Count)
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return client.ForkResult{}, err
	}
	if _, err := s.ttl(req.Timeout); err != nil {
		return client.ForkResult{}, err
	}
	if err := s.validWait(req.WaitSeconds); err != nil {
		return client.ForkResult{}, err
	}
	src, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.ForkResult{}, err
	}
	// Forks are metered at their source's tariff, if it still exists and
	// the source fits it (one created without a tariff may not: then the
	// default's prices).
	tariff := src.row.Tariff
	if tariff != "" && s.cfg.Tariffs != nil {
		t, err := s.tariff(ctx, tariff)
		if err != nil || src.row.CPU > t.CPU || src.row.MemoryMB > t.MemoryMB || src.row.DiskMB > t.DiskMB {
			tariff = ""
		}
	}
	// The balance must cover all of them, before the snapshot is taken
	// (each create checks again on its own).
	bt, _, priced, err := s.tariffOf(ctx, tariff)
	if err != nil {
		return client.ForkResult{}, err
	}
	if err := s.admitBilling(ctx, teamID, bt, priced, nodeapi.Shape{CPU: src.row.CPU, MemoryMB: src.row.MemoryMB, DiskMB: src.row.DiskMB}, req.Count); err != nil {
		return client.ForkResult{}, err
	}
	// Past the team's limit the fork fails before it takes anything
	// (unless it may wait for room).
	if req.WaitSeconds == 0 {
		team, err := s.Team(ctx, teamID)
		if err != nil {
			return client.ForkResult{}, err
		}
		running, err := s.store.ListSandboxes(ctx, teamID, store.SandboxFilter{States: []string{client.StateRunning}})
		if err != nil {
			return client.ForkResult{}, err
		}
		if free := team.Limits.MaxSandboxes - len(running); req.Count > free {
			return client.ForkResult{}, &apierr.Error{Code: client.CodeTooManySandboxes, RetryAfter: 1,
				Message: fmt.Sprintf("a fork of %d needs %d free sandboxes; team %s has %d of its %d (delete some, or pass wait_seconds)",
					req.Count, req.Count, team.Name, max(free, 0), team.Limits.MaxSandboxes)}
		}
	}
	sn, err := s.Snapshot(ctx, teamID, id)
	if err != nil {
		return client.ForkResult{}, err
	}
	keep := false
	defer func() {
		if !keep && !req.KeepSnapshot {
			if err := s.DeleteSnapshot(context.WithoutCancel(ctx), teamID, sn.ID); err != nil {
				s.log.Warn("removing a fork's snapshot", "snapshot", sn.ID, "err", err)
			}
		}
	}()
	out := make([]client.Sandbox, req.Count)
	errs := make([]error, req.Count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, forkParallel)
	for i := range req.Count {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = s.Create(ctx, teamID, client.CreateSandboxRequest{Snapshot: sn.ID, Timeout: req.Timeout,
				Metadata: req.Metadata, WaitSeconds: req.WaitSeconds, Tariff: tariff})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, sb := range out {
			if errs[i] == nil {
				if derr := s.Delete(context.WithoutCancel(ctx), teamID, sb.ID); derr != nil {
					s.log.Warn("deleting a sandbox of a failed fork", "sandbox", sb.ID, "err", derr)
				}
			}
		}
		for _, e := range errs {
			if e != nil {
				return client.ForkResult{}, e // the first: each says why
			}
		}
	}
	res := client.ForkResult{Sandboxes: out}
	if req.KeepSnapshot {
		keep = true
		res.Snapshot = &sn
	}
	s.log.Info("sandbox forked", "sandbox", id, "team", teamID, "count", req.Count, "snapshot", sn.ID, "kept", keep)
	return res, nil
}

// forkParallel is how many of a fork's sandboxes are restored at once.
const forkParallel = 8

// Pause pauses the team's running sandbox: its memory and processes go to
// its node's disk, and it takes no CPU or memory there until Resume. It
// keeps its team slot and its TTL (a paused sandbox expires as any).
func (s *Service) Pause(ctx context.Context, teamID, id string) (client.Sandbox, error) {
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.Sandbox{}, err
	}
	nctx, cancel := nodeCallContext(ctx, 0)
	defer cancel()
	if err := s.node.Pause(nctx, id); err != nil {
		return client.Sandbox{}, nodeErr(err)
	}
	at := time.Now().UTC()
	return s.setPaused(ctx, e, &at)
}

// Resume resumes the team's paused sandbox, waiting up to waitSeconds for
// host capacity. Of two resumes at once, one resumes it and the other is
// a conflict.
func (s *Service) Resume(ctx context.Context, teamID, id string, waitSeconds int) (client.Sandbox, error) {
	if err := s.validWait(waitSeconds); err != nil {
		return client.Sandbox{}, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.Sandbox{}, err
	}
	wait := time.Duration(waitSeconds) * time.Second
	nctx, cancel := nodeCallContext(ctx, wait)
	defer cancel()
	if err := s.node.Resume(nctx, id, wait); err != nil {
		if cerr := (*nodeapi.CapacityError)(nil); errors.As(err, &cerr) {
			return client.Sandbox{}, &apierr.Error{Code: client.CodeInsufficientCapacity, RetryAfter: 1, Err: err,
				Message: fmt.Sprintf("the host has no room to resume sandbox %s: %v; retry later, or pass wait_seconds", id, cerr)}
		}
		return client.Sandbox{}, nodeErr(err)
	}
	return s.setPaused(ctx, e, nil)
}

// setPaused records a pause (at) or a resume (nil) in the row and the
// entry, and returns the row.
func (s *Service) setPaused(ctx context.Context, e *entry, at *time.Time) (client.Sandbox, error) {
	if err := s.store.SetPaused(context.WithoutCancel(ctx), e.row.TeamID, e.row.ID, at); err != nil {
		if errors.Is(err, store.ErrNotRunning) {
			return client.Sandbox{}, errorf(client.CodeSandboxNotRunning, "sandbox %s is no longer running", e.row.ID)
		}
		return client.Sandbox{}, err
	}
	s.mu.Lock()
	e.row.PausedAt = at
	row := e.row
	row.ExpiresAt = e.expires
	s.mu.Unlock()
	return row, nil
}
