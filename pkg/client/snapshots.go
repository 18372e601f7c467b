package client

import (
	"context"
	"net/http"
)

// Snapshot snapshots a running sandbox (gVisor: its files, memory and
// processes; namespaces: its files). The sandbox goes on.
func (c *Client) Snapshot(ctx context.Context, id string) (*Snapshot, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var sn Snapshot
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/snapshots"}, &sn); err != nil {
		return nil, err
	}
	return &sn, nil
}

// ListSnapshots lists the team's snapshots, newest first.
func (c *Client) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	var l SnapshotList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/snapshots", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Snapshots, nil
}

// GetSnapshot returns one of the team's snapshots.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var sn Snapshot
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/snapshots/" + seg(id), retry: true}, &sn); err != nil {
		return nil, err
	}
	return &sn, nil
}

// DeleteSnapshot deletes one of the team's snapshots.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/snapshots/" + seg(id), retry: true}, nil)
}

// Fork snapshots a running sandbox once and makes req.Count sandboxes from
// it (all or none).
func (c *Client) Fork(ctx context.Context, id string, req ForkRequest) (*ForkResult, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var res ForkResult
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/fork", in: &req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Pause pauses a running sandbox: its memory and processes go to disk.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var sb Sandbox
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/pause"}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Resume resumes a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string, req ResumeRequest) (*Sandbox, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var sb Sandbox
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/resume", in: &req}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
