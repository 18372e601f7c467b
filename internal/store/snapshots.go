package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/evalbox/evalbox/pkg/client"
)

// Snapshot rows are client.Snapshot values (NetworkRules as JSON, "" for
// none). The snapshot's files are on its node (NodeID); the row is what
// the control plane knows of them.

const snapshotCols = `id, team_id, sandbox_id, template, template_digest, runtime, runtime_version,
	cpu, memory_mb, disk_mb, network, network_rules, memory, size_bytes, created_at, node_id`

// InsertSnapshot stores a snapshot. Its id must be set (the node names
// it); a duplicate is ErrConflict, an unknown team ErrNotFound.
func (s *Store) InsertSnapshot(ctx context.Context, sn client.Snapshot) (client.Snapshot, error) {
	if sn.ID == "" || sn.TeamID == "" {
		return client.Snapshot{}, errors.New("store: insert snapshot: id and team are required")
	}
	if sn.CreatedAt.IsZero() {
		sn.CreatedAt = now()
	}
	sn.CreatedAt = norm(sn.CreatedAt)
	rules, err := rulesJSON(sn.NetworkRules)
	if err != nil {
		return client.Snapshot{}, fmt.Errorf("store: insert snapshot: %w", err)
	}
	_, err = s.exec(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.TeamID, sn.SandboxID, sn.Template, sn.TemplateDigest, sn.Runtime, sn.RuntimeVersion,
		sn.CPU, sn.MemoryMB, sn.DiskMB, sn.Network, rules, boolInt(sn.Memory), sn.SizeBytes, toDB(sn.CreatedAt), sn.NodeID)
	if err != nil {
		return client.Snapshot{}, fmt.Errorf("store: insert snapshot %s: %w", sn.ID, s.mapConstraint(err, "team"))
	}
	return sn, nil
}

// GetSnapshot returns the team's snapshot; another team's is ErrNotFound.
func (s *Store) GetSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error) {
	sn, err := scanSnapshot(s.queryRow(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ? AND team_id = ?`, id, teamID))
	if err != nil {
		return client.Snapshot{}, fmt.Errorf("store: get snapshot %s: %w", id, err)
	}
	return sn, nil
}

// SnapshotNode returns the node that holds a snapshot, whichever team's
// (the fleet's router asks).
func (s *Store) SnapshotNode(ctx context.Context, id string) (string, error) {
	var node string
	err := s.queryRow(ctx, `SELECT node_id FROM snapshots WHERE id = ?`, id).Scan(&node)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: snapshot %s: %w", id, err)
	}
	return node, nil
}

// ListSnapshots returns the team's snapshots, newest first.
func (s *Store) ListSnapshots(ctx context.Context, teamID string) ([]client.Snapshot, error) {
	rows, err := s.query(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE team_id = ? ORDER BY created_at DESC, id DESC`, teamID)
	if err != nil {
		return nil, fmt.Errorf("store: list snapshots: %w", err)
	}
	defer rows.Close()
	out := []client.Snapshot{}
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list snapshots: %w", err)
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes the team's snapshot row and returns it; an
// unknown one (or another team's) is ErrNotFound.
func (s *Store) DeleteSnapshot(ctx context.Context, teamID, id string) (client.Snapshot, error) {
	sn, err := scanSnapshot(s.writeRow(ctx, `DELETE FROM snapshots WHERE id = ? AND team_id = ? RETURNING `+snapshotCols, id, teamID))
	if err != nil {
		return client.Snapshot{}, fmt.Errorf("store: delete snapshot %s: %w", id, err)
	}
	return sn, nil
}

// SnapshotBytes is what the team's snapshots count against its storage.
func (s *Store) SnapshotBytes(ctx context.Context, teamID string) (int64, error) {
	var n sql.NullInt64
	if err := s.queryRow(ctx, `SELECT SUM(size_bytes) FROM snapshots WHERE team_id = ?`, teamID).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: snapshot bytes: %w", err)
	}
	return n.Int64, nil
}

func scanSnapshot(sc scanner) (client.Snapshot, error) {
	var sn client.Snapshot
	var rules string
	var memory, created int64
	err := sc.Scan(&sn.ID, &sn.TeamID, &sn.SandboxID, &sn.Template, &sn.TemplateDigest, &sn.Runtime, &sn.RuntimeVersion,
		&sn.CPU, &sn.MemoryMB, &sn.DiskMB, &sn.Network, &rules, &memory, &sn.SizeBytes, &created, &sn.NodeID)
	if errors.Is(err, sql.ErrNoRows) {
		return client.Snapshot{}, ErrNotFound
	}
	if err != nil {
		return client.Snapshot{}, err
	}
	if rules != "" {
		sn.NetworkRules = &client.NetworkRuleLists{}
		if err := json.Unmarshal([]byte(rules), sn.NetworkRules); err != nil {
			return client.Snapshot{}, fmt.Errorf("snapshot %s network rules: %w", sn.ID, err)
		}
	}
	sn.Memory = memory != 0
	sn.CreatedAt = fromDB(created)
	return sn, nil
}
