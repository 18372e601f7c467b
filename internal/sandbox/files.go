package sandbox

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

// checkPath validates a sandbox path at the edge; the agent checks again.
func checkPath(p string) error {
	if p == "" {
		return errorf(client.CodeBadRequest, "path is required")
	}
	if !strings.HasPrefix(p, "/") {
		return errorf(client.CodeBadRequest, "path must be absolute, got %q", p)
	}
	if strings.ContainsRune(p, 0) {
		return errorf(client.CodeBadRequest, "path must not contain NUL bytes")
	}
	if len(p) > 4096 {
		return errorf(client.CodeBadRequest, "path is longer than 4096 bytes")
	}
	return nil
}

// ParseMode reads an octal permission string ("0644", "755"); "" is def.
func ParseMode(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errorf(client.CodeBadRequest, "mode %q is not an octal permission like 0644", s)
	}
	return uint32(m), nil
}

func fileInfo(f nodeapi.FileInfo) client.FileInfo {
	return client.FileInfo{Name: f.Name, Path: f.Path, Type: f.Type, Size: f.Size,
		Mode: fmt.Sprintf("%04o", f.Mode), ModTime: f.ModTime, Target: f.Target}
}

// MaxFileBytes is the largest upload the service accepts.
func (s *Service) MaxFileBytes() int64 { return s.cfg.MaxFileBytes }

// WriteFile streams r into path (parents created), atomically: a failed or
// oversize upload leaves no file.
func (s *Service) WriteFile(ctx context.Context, teamID, id, path, mode string, r io.Reader) (client.FileInfo, error) {
	if err := checkPath(path); err != nil {
		return client.FileInfo{}, err
	}
	m, err := ParseMode(mode, 0o644)
	if err != nil {
		return client.FileInfo{}, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.FileInfo{}, err
	}
	fi, err := s.node.WriteFile(ctx, e.row.ID, path, r, nodeapi.WriteOptions{Mode: m, Parents: true, MaxBytes: s.cfg.MaxFileBytes})
	if err != nil {
		return client.FileInfo{}, s.callErr(e, err)
	}
	return fileInfo(fi), nil
}

// OpenFile opens a file for download: its info first, then its bytes.
func (s *Service) OpenFile(ctx context.Context, teamID, id, path string) (client.FileInfo, io.ReadCloser, error) {
	if err := checkPath(path); err != nil {
		return client.FileInfo{}, nil, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.FileInfo{}, nil, err
	}
	fi, rc, err := s.node.OpenFile(ctx, e.row.ID, path)
	if err != nil {
		return client.FileInfo{}, nil, s.callErr(e, err)
	}
	return fileInfo(fi), rc, nil
}

// StatFile describes a path.
func (s *Service) StatFile(ctx context.Context, teamID, id, path string) (client.FileInfo, error) {
	if err := checkPath(path); err != nil {
		return client.FileInfo{}, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.FileInfo{}, err
	}
	fi, err := s.node.Stat(ctx, e.row.ID, path)
	if err != nil {
		return client.FileInfo{}, s.callErr(e, err)
	}
	return fileInfo(fi), nil
}

// ListFiles lists a directory.
func (s *Service) ListFiles(ctx context.Context, teamID, id, path string) ([]client.FileInfo, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	fs, err := s.node.ListDir(ctx, e.row.ID, path)
	if err != nil {
		return nil, s.callErr(e, err)
	}
	out := make([]client.FileInfo, 0, len(fs))
	for _, f := range fs {
		out = append(out, fileInfo(f))
	}
	return out, nil
}

// Mkdir creates a directory.
func (s *Service) Mkdir(ctx context.Context, teamID, id string, req client.MkdirRequest) (client.FileInfo, error) {
	if err := checkPath(req.Path); err != nil {
		return client.FileInfo{}, err
	}
	m, err := ParseMode(req.Mode, 0o755)
	if err != nil {
		return client.FileInfo{}, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.FileInfo{}, err
	}
	fi, err := s.node.Mkdir(ctx, e.row.ID, req.Path, nodeapi.MkdirOptions{Mode: m, Parents: req.Parents})
	if err != nil {
		return client.FileInfo{}, s.callErr(e, err)
	}
	return fileInfo(fi), nil
}

// RenameFile moves a file or directory to req.Target (replacing a file or
// an empty directory there).
func (s *Service) RenameFile(ctx context.Context, teamID, id string, req client.RenameRequest) (client.FileInfo, error) {
	if err := checkPath(req.Path); err != nil {
		return client.FileInfo{}, err
	}
	if err := checkPath(req.Target); err != nil {
		return client.FileInfo{}, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return client.FileInfo{}, err
	}
	fi, err := s.node.Rename(ctx, e.row.ID, req.Path, req.Target)
	if err != nil {
		return client.FileInfo{}, s.callErr(e, err)
	}
	return fileInfo(fi), nil
}

// RemoveFile removes a path (a directory tree with recursive).
func (s *Service) RemoveFile(ctx context.Context, teamID, id, path string, recursive bool) error {
	if err := checkPath(path); err != nil {
		return err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return err
	}
	if err := s.node.Remove(ctx, e.row.ID, path, recursive); err != nil {
		return s.callErr(e, err)
	}
	return nil
}
