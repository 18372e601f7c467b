package agent

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// identity is a resolved sandbox user.
type identity struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
	home   string
}

// lookupUser resolves a user name or numeric uid against the sandbox's
// /etc/passwd and /etc/group. A numeric uid without a passwd entry is
// allowed (gid = uid, home /), as container runtimes do.
func lookupUser(spec string) (*identity, error) {
	var (
		u   *user.User
		err error
	)
	uid, numErr := strconv.ParseUint(spec, 10, 32)
	if numErr == nil {
		u, err = user.LookupId(spec)
		if err != nil {
			return &identity{name: spec, uid: uint32(uid), gid: uint32(uid), home: "/"}, nil
		}
	} else if u, err = user.Lookup(spec); err != nil {
		return nil, fmt.Errorf("unknown user %q", spec)
	}
	id := &identity{name: u.Username, home: u.HomeDir}
	if id.uid, err = parseID(u.Uid); err != nil {
		return nil, fmt.Errorf("user %q: bad uid %q", spec, u.Uid)
	}
	if id.gid, err = parseID(u.Gid); err != nil {
		return nil, fmt.Errorf("user %q: bad gid %q", spec, u.Gid)
	}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := parseID(g); err == nil {
				id.groups = append(id.groups, n)
			}
		}
	}
	return id, nil
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err
}

// credential returns the credential a child needs to run as id, or nil
// when it runs as the agent's own user without privileges to switch.
func (id *identity) credential() *syscall.Credential {
	if os.Geteuid() != 0 && int(id.uid) == os.Geteuid() {
		return nil
	}
	return &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
}

// chown gives p to id (without following a final symlink).
func (id *identity) chown(p string) error {
	return os.Lchown(p, int(id.uid), int(id.gid))
}
