// Package secrets seals the values of sandbox secrets at rest (issue 16,
// docs/design/accounts.md): AES-256-GCM with a random nonce under a data
// key of the server's keyring, bound to what the value belongs to (the
// additional data: a team and a name), so that a sealed value moved to
// another row does not open. The keyring is a file in the data dir, the
// owner's alone, made at first start; rotation adds a key that seals from
// then on, and the older keys still open what they sealed until it is
// sealed again (NeedsReseal).
//
// A sealed value is "evs1" | key id (4 bytes, big endian) | nonce (12) |
// ciphertext and tag.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// magic starts every sealed value (its format's version).
const magic = "evs1"

const (
	keySize   = 32 // AES-256
	nonceSize = 12
	header    = len(magic) + 4 + nonceSize
)

// ErrOpen is a sealed value that does not open: another key, other
// additional data, or altered bytes.
var ErrOpen = errors.New("secrets: the value does not open (wrong key or binding, or altered)")

// Keyring holds a server's data keys by id; Current seals.
type Keyring struct {
	path    string
	mu      sync.RWMutex
	keys    map[uint32]cipher.AEAD
	raw     map[uint32][]byte
	current uint32
}

// file is the keyring on disk.
type file struct {
	Current uint32            `json:"current"`
	Keys    map[string]string `json:"keys"` // id → base64 key
}

// Load opens the keyring at path, making it with one key when it does not
// exist. A keyring others may read or write is refused: its keys would be
// theirs. It must be owned by this process's user (or root), and group
// read is allowed only for the process's own group (a Kubernetes Secret
// mounted with the pod's fsGroup, which the kubelet always makes
// group-readable): its members are this server.
func Load(path string) (*Keyring, error) {
	f, err := readKeyring(path)
	if errors.Is(err, os.ErrNotExist) {
		k := &Keyring{path: path, keys: map[uint32]cipher.AEAD{}, raw: map[uint32][]byte{}}
		if _, err := k.add(1); err != nil {
			return nil, err
		}
		if err := k.save(); err != nil {
			return nil, err
		}
		return k, nil
	}
	if err != nil {
		return nil, err
	}
	k := &Keyring{path: path, keys: map[uint32]cipher.AEAD{}, raw: map[uint32][]byte{}}
	if err := k.merge(f); err != nil {
		return nil, err
	}
	return k, nil
}

// readKeyring reads and checks the keyring file at path (its mode and
// owner checked on the file opened, not on the path).
func readKeyring(path string) (file, error) {
	fd, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return file{}, err
	}
	if err != nil {
		return file{}, fmt.Errorf("secrets: %w", err)
	}
	defer fd.Close()
	fi, err := fd.Stat()
	if err != nil {
		return file{}, fmt.Errorf("secrets: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o037 != 0 || (perm&0o040 != 0 && !ownGroup(fi)) {
		return file{}, fmt.Errorf("secrets: %s is mode %v: others may read the keys; chmod 600 it", path, perm)
	}
	if !ownedByUs(fi) {
		return file{}, fmt.Errorf("secrets: %s is another user's: its owner could read or replace the keys; chown it to this server's user", path)
	}
	b, err := io.ReadAll(io.LimitReader(fd, 1<<20))
	if err != nil {
		return file{}, fmt.Errorf("secrets: %w", err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return file{}, fmt.Errorf("secrets: %s: %w", path, err)
	}
	return f, nil
}

// merge installs f's keys (a key id already held keeps its key) and makes
// its current key current.
func (k *Keyring) merge(f file) error {
	for sid, s := range f.Keys {
		id, err := strconv.ParseUint(sid, 10, 32)
		if err != nil {
			return fmt.Errorf("secrets: %s: key id %q: %w", k.path, sid, err)
		}
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(raw) != keySize {
			return fmt.Errorf("secrets: %s: key %d is not %d base64 bytes", k.path, id, keySize)
		}
		if _, held := k.keys[uint32(id)]; held {
			continue
		}
		if err := k.set(uint32(id), raw); err != nil {
			return err
		}
	}
	if _, ok := k.keys[f.Current]; !ok {
		return fmt.Errorf("secrets: %s: the current key %d is not in the keyring", k.path, f.Current)
	}
	k.current = f.Current
	return nil
}

// reload reads the keyring file again for keys this process lacks: a
// rotation made by another replica's operator (a Kubernetes Secret is
// updated in place), which may already have resealed the stored secrets.
func (k *Keyring) reload() error {
	f, err := readKeyring(k.path)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.merge(f)
}

// set installs a raw key under id.
func (k *Keyring) set(id uint32, raw []byte) error {
	block, err := aes.NewCipher(raw)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	k.keys[id], k.raw[id] = aead, raw
	return nil
}

// add makes a random key under id and makes it current.
func (k *Keyring) add(id uint32) (uint32, error) {
	raw := make([]byte, keySize)
	if _, err := rand.Read(raw); err != nil {
		return 0, fmt.Errorf("secrets: %w", err)
	}
	if err := k.set(id, raw); err != nil {
		return 0, err
	}
	k.current = id
	return id, nil
}

// save writes the keyring, 0600, through a file renamed into place.
func (k *Keyring) save() error {
	f := file{Current: k.current, Keys: map[string]string{}}
	for id, raw := range k.raw {
		f.Keys[strconv.FormatUint(uint64(id), 10)] = base64.StdEncoding.EncodeToString(raw)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(k.path), "."+filepath.Base(k.path)+".*")
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("secrets: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("secrets: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("secrets: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	if err := os.Rename(tmp.Name(), k.path); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	return nil
}

// Rotate adds a key that seals from now on, saved before it is used; it
// returns its id.
func (k *Keyring) Rotate() (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	prev := k.current
	var next uint32
	for id := range k.keys {
		next = max(next, id)
	}
	id, err := k.add(next + 1)
	if err != nil {
		return 0, err
	}
	if err := k.save(); err != nil {
		delete(k.keys, id)
		delete(k.raw, id)
		k.current = prev
		return 0, err
	}
	return id, nil
}

// Current is the id of the key that seals.
func (k *Keyring) Current() uint32 {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.current
}

// Seal seals value, bound to binding (e.g. the team and the secret's
// name: Open needs the same).
func (k *Keyring) Seal(value, binding []byte) ([]byte, error) {
	k.mu.RLock()
	id, aead := k.current, k.keys[k.current]
	k.mu.RUnlock()
	out := make([]byte, header, header+len(value)+aead.Overhead())
	copy(out, magic)
	binary.BigEndian.PutUint32(out[len(magic):], id)
	nonce := out[len(magic)+4 : header]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	return aead.Seal(out, nonce, value, binding), nil
}

// Open opens a sealed value with the binding it was sealed with.
func (k *Keyring) Open(sealed, binding []byte) ([]byte, error) {
	if len(sealed) < header || string(sealed[:len(magic)]) != magic {
		return nil, ErrOpen
	}
	id := binary.BigEndian.Uint32(sealed[len(magic):])
	k.mu.RLock()
	aead, ok := k.keys[id]
	k.mu.RUnlock()
	if !ok {
		// Rotated since this process read the file?
		if err := k.reload(); err != nil {
			return nil, fmt.Errorf("%w: key %d is not in the keyring (reading it again: %v)", ErrOpen, id, err)
		}
		k.mu.RLock()
		aead, ok = k.keys[id]
		k.mu.RUnlock()
		if !ok {
			return nil, fmt.Errorf("%w: key %d is not in the keyring %s (API replicas that share a database need the same --secrets-keys)", ErrOpen, id, k.path)
		}
	}
	v, err := aead.Open(nil, sealed[len(magic)+4:header], sealed[header:], binding)
	if err != nil {
		return nil, ErrOpen
	}
	return v, nil
}

// NeedsReseal reports whether sealed was sealed with another key than the
// current one (after a rotation: open it and seal it again).
func (k *Keyring) NeedsReseal(sealed []byte) bool {
	if len(sealed) < header {
		return false
	}
	return binary.BigEndian.Uint32(sealed[len(magic):]) != k.Current()
}

// ownGroup reports whether fi's group is the process's (primary) group:
// a supplementary group (users, staff) may have other members.
func ownGroup(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Gid) == os.Getgid()
}

// ownedByUs reports whether fi is owned by the process's user or by root.
func ownedByUs(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && (int(st.Uid) == os.Geteuid() || st.Uid == 0)
}
