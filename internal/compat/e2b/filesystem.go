package e2b

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/compat/e2b/envdpb/filesystempb"
	"github.com/evalbox/evalbox/pkg/client"
)

// filesystemService is envd's filesystem.Filesystem on evalbox's files
// calls (the agent's, through the node).
type filesystemService struct {
	h *Handler
}

// maxListDepth bounds ListDir's depth, and maxListEntries its answer.
const (
	maxListDepth   = 16
	maxListEntries = 100_000
)

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystempb.StatRequest]) (*connect.Response[filesystempb.StatResponse], error) {
	c := callOf(ctx)
	fi, err := s.h.cfg.Sandboxes.StatFile(ctx, c.team, c.id, req.Msg.Path)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.StatResponse{Entry: entryInfo(fi)}), nil
}

func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystempb.ListDirRequest]) (*connect.Response[filesystempb.ListDirResponse], error) {
	c := callOf(ctx)
	depth := int(req.Msg.Depth)
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth %d: at most %d", depth, maxListDepth))
	}
	out := &filesystempb.ListDirResponse{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		files, err := s.h.cfg.Sandboxes.ListFiles(ctx, c.team, c.id, dir)
		if err != nil {
			return err
		}
		for _, fi := range files {
			if len(out.Entries) >= maxListEntries {
				return apierr.Errorf(client.CodePayloadTooLarge, "more than %d entries under %s", maxListEntries, req.Msg.Path)
			}
			out.Entries = append(out.Entries, entryInfo(fi))
			if fi.Type == "dir" && level < depth {
				if err := walk(fi.Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(req.Msg.Path, 1); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(out), nil
}

func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystempb.MakeDirRequest]) (*connect.Response[filesystempb.MakeDirResponse], error) {
	c := callOf(ctx)
	if _, err := s.h.cfg.Sandboxes.StatFile(ctx, c.team, c.id, req.Msg.Path); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s already exists", req.Msg.Path))
	}
	fi, err := s.h.cfg.Sandboxes.Mkdir(ctx, c.team, c.id, client.MkdirRequest{Path: req.Msg.Path, Parents: true})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.MakeDirResponse{Entry: entryInfo(fi)}), nil
}

func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystempb.RemoveRequest]) (*connect.Response[filesystempb.RemoveResponse], error) {
	c := callOf(ctx)
	if err := s.h.cfg.Sandboxes.RemoveFile(ctx, c.team, c.id, req.Msg.Path, true); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.RemoveResponse{}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[filesystempb.MoveRequest]) (*connect.Response[filesystempb.MoveResponse], error) {
	c := callOf(ctx)
	fi, err := s.h.cfg.Sandboxes.RenameFile(ctx, c.team, c.id, client.RenameRequest{Path: req.Msg.Source, Target: req.Msg.Destination})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.MoveResponse{Entry: entryInfo(fi)}), nil
}

// fsError is a files call's error for the SDKs: a missing path is
// not_found (FileNotFoundException), an existing one already_exists.
func fsError(err error) error { return connectError(err) }

// entryInfo is fi as envd's EntryInfo.
func entryInfo(fi client.FileInfo) *filesystempb.EntryInfo {
	mode, _ := strconv.ParseUint(fi.Mode, 8, 32)
	e := &filesystempb.EntryInfo{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: uint32(mode),
		ModifiedTime: timestamppb.New(fi.ModTime),
	}
	if e.Name == "" {
		e.Name = path.Base(fi.Path)
	}
	perm := fs.FileMode(mode) & fs.ModePerm
	switch fi.Type {
	case "file":
		e.Type = filesystempb.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = filesystempb.FileType_FILE_TYPE_DIRECTORY
		perm |= fs.ModeDir
	case "symlink":
		e.Type = filesystempb.FileType_FILE_TYPE_SYMLINK
		e.IsSymlink = true
		perm |= fs.ModeSymlink
		if fi.Target != "" {
			t := fi.Target
			e.SymlinkTarget = &t
		}
	}
	e.Permissions = perm.String()
	return e
}
