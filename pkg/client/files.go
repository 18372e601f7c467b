package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
)

// WriteFile uploads r as the file at path (absolute) in a sandbox, creating
// missing parent directories and replacing an existing file. size is r's
// length, or -1 when unknown (the body is then sent chunked). mode's
// permission bits are applied (0 = the server's default, 0644). The body is
// streamed, never held in memory whole. When r is also an io.Seeker the
// upload is retried after a 429/503 answer; r is not closed.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, mode fs.FileMode) (*FileInfo, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	if size < 0 {
		size = -1
	}
	q := url.Values{"path": {path}}
	if perm := mode.Perm(); perm != 0 {
		q.Set("mode", fmt.Sprintf("%04o", uint32(perm)))
	}
	var fi FileInfo
	err := c.do(ctx, &request{
		method: http.MethodPut, path: "/sandboxes/" + seg(id) + "/files", query: q,
		raw: r, rawSize: size, retry: true,
	}, &fi)
	if err != nil {
		return nil, err
	}
	return &fi, nil
}

// ReadFile downloads the file at path in a sandbox. It returns the content
// as a stream, which the caller must close, and its size (-1 when the server
// did not say).
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	if err := checkIDs(id); err != nil {
		return nil, 0, err
	}
	resp, err := c.send(ctx, &request{
		method: http.MethodGet, path: "/sandboxes/" + seg(id) + "/files", query: url.Values{"path": {path}},
		accept: ContentTypeOctetStream, retry: true,
	})
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// StatFile describes path in a sandbox (a symlink itself, not its target).
func (c *Client) StatFile(ctx context.Context, id, path string) (*FileInfo, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var fi FileInfo
	err := c.do(ctx, &request{
		method: http.MethodGet, path: "/sandboxes/" + seg(id) + "/files/stat", query: url.Values{"path": {path}}, retry: true,
	}, &fi)
	if err != nil {
		return nil, err
	}
	return &fi, nil
}

// ListFiles lists the directory at path in a sandbox, sorted by name.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]FileInfo, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var l FileList
	err := c.do(ctx, &request{
		method: http.MethodGet, path: "/sandboxes/" + seg(id) + "/files/list", query: url.Values{"path": {path}}, retry: true,
	}, &l)
	if err != nil {
		return nil, err
	}
	return l.Files, nil
}

// Mkdir creates a directory in a sandbox.
// RenameFile moves a file or directory of the sandbox (rename(2)).
func (c *Client) RenameFile(ctx context.Context, id, path, target string) (*FileInfo, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var fi FileInfo
	req := RenameRequest{Path: path, Target: target}
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/files/rename", in: &req}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

func (c *Client) Mkdir(ctx context.Context, id string, req MkdirRequest) (*FileInfo, error) {
	if err := checkIDs(id); err != nil {
		return nil, err
	}
	var fi FileInfo
	err := c.do(ctx, &request{method: http.MethodPost, path: "/sandboxes/" + seg(id) + "/files/mkdir", in: &req, retry: true}, &fi)
	if err != nil {
		return nil, err
	}
	return &fi, nil
}

// RemoveFile removes path in a sandbox; a non-empty directory needs
// recursive.
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", strconv.FormatBool(true))
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/sandboxes/" + seg(id) + "/files", query: q, retry: true}, nil)
}

// WatchDir follows the changes under a directory of the sandbox (with
// recursive, the directories under it too): fn gets the start event once
// the directory is watched, then each change (keepalives are skipped).
// It returns nil when the directory itself goes (the end event), the
// watch's error, fn's error, or ctx's when it ends.
func (c *Client) WatchDir(ctx context.Context, id, path string, recursive bool, fn func(WatchEvent) error) error {
	if err := checkIDs(id); err != nil {
		return err
	}
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: "/sandboxes/" + seg(id) + "/files/watch", query: q,
		accept: ContentTypeNDJSON, retry: true})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev WatchEvent
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return errWatchNoEnd
			}
			return fmt.Errorf("evalbox: reading watch events: %w", err)
		}
		switch ev.Type {
		case WatchKeepalive:
			continue
		case WatchEnd:
			return nil
		case WatchError:
			e := &APIError{Code: CodeInternal, Message: "error event without detail"}
			if ev.Error != nil {
				e.Code, e.Message = ev.Error.Code, ev.Error.Message
			}
			return e
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// errWatchNoEnd: the stream was cut before its end (or error) event.
var errWatchNoEnd = errors.New("evalbox: the watch stream ended without its end event")
