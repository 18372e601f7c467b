package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/evalbox/evalbox/internal/agentproto"
)

// errorf returns a protocol error with code.
func errorf(code, format string, args ...any) *agentproto.Error {
	return &agentproto.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// fsError maps a filesystem error about path p to a protocol error. The
// message names p (the path the caller gave), never an internal name such
// as an upload's temporary file.
func fsError(p string, err error) *agentproto.Error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return errorf(agentproto.CodeInternal, "%s: %v", p, err)
	}
	return &agentproto.Error{Code: errnoCode(errno), Message: p + ": " + errno.Error()}
}

// errnoCode maps an errno to a protocol error code.
func errnoCode(errno syscall.Errno) string {
	switch errno {
	case syscall.ENOENT:
		return agentproto.CodeNotFound
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return agentproto.CodePermission
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		return agentproto.CodeNoSpace
	case syscall.EISDIR:
		return agentproto.CodeIsDir
	case syscall.ENOTDIR:
		return agentproto.CodeNotDir
	case syscall.EEXIST, syscall.ENOTEMPTY, syscall.EBUSY, syscall.ETXTBSY:
		return agentproto.CodeExists
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP:
		return agentproto.CodeBadRequest
	}
	return agentproto.CodeInternal
}

// isNotExist reports whether err says a path does not exist.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
