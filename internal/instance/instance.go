// Package instance names one evalbox server on its host. Several servers
// (one per data dir) may share a host; every name they make host-wide —
// cgroup parents, network link aliases — carries the instance id, so that a
// server's sweep never touches another's sandboxes. The server makes these
// names and the leak checks (internal/leaks) look for them: both take them
// from here.
package instance

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
)

// ID names the server of dataDir on the host: the first 4 bytes of the
// SHA-256 of its absolute path, in hex.
func ID(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:4])
}

// The prefixes of the runtimes' cgroup parents; the instance id follows.
const (
	GVisorCgroupPrefix     = "evalbox-gv-"
	NamespacesCgroupPrefix = "evalbox-ns-"
)

// GVisorCgroupParent is the cgroup parent of instance id's gVisor
// sandboxes, in every hierarchy.
func GVisorCgroupParent(id string) string { return GVisorCgroupPrefix + id }

// NamespacesCgroupParent is the cgroup parent of instance id's namespaces
// sandboxes, in every hierarchy (the cgroup2 one included).
func NamespacesCgroupParent(id string) string { return NamespacesCgroupPrefix + id }
