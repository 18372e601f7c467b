package secrets

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSealOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.keys")
	k, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring file: %v, %v", fi, err)
	}
	value, binding := []byte("sk-evalbox-canary-1234"), []byte("team-a\x00OPENAI_API_KEY")
	sealed, err := k.Seal(value, binding)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, value) || bytes.Contains(sealed, []byte("canary")) {
		t.Fatal("the sealed value holds the plaintext")
	}
	again, _ := k.Seal(value, binding)
	if bytes.Equal(again, sealed) {
		t.Error("two seals of one value are equal (the nonce is not random)")
	}
	if got, err := k.Open(sealed, binding); err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	// Another binding (another team's row), altered bytes, a truncated
	// value, no header: none opens.
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	for name, tc := range map[string][2][]byte{
		"other binding": {sealed, []byte("team-b\x00OPENAI_API_KEY")},
		"altered":       {tampered, binding},
		"truncated":     {sealed[:header], binding},
		"not sealed":    {value, binding},
	} {
		if _, err := k.Open(tc[0], tc[1]); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: %v, want ErrOpen", name, err)
		}
	}
	// Another server's keyring does not open it.
	other, err := Load(filepath.Join(t.TempDir(), "secrets.keys"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Open(sealed, binding); !errors.Is(err, ErrOpen) {
		t.Errorf("another keyring: %v", err)
	}
	// Reloaded, the keyring opens what it sealed; the file holds no value.
	k2, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k2.Open(sealed, binding); err != nil || !bytes.Equal(got, value) {
		t.Fatalf("after a reload: %q, %v", got, err)
	}
	if b, _ := os.ReadFile(path); bytes.Contains(b, value) {
		t.Error("the keyring file holds a value")
	}
}

func TestRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.keys")
	k, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := k.Seal([]byte("v"), nil)
	id, err := k.Rotate()
	if err != nil || id != 2 || k.Current() != 2 {
		t.Fatalf("Rotate = %d, %v (current %d)", id, err, k.Current())
	}
	if !k.NeedsReseal(old) {
		t.Error("a value of the old key does not need resealing")
	}
	if v, err := k.Open(old, nil); err != nil || string(v) != "v" {
		t.Errorf("the old key no longer opens its value: %q, %v", v, err)
	}
	fresh, _ := k.Seal([]byte("w"), nil)
	if k.NeedsReseal(fresh) {
		t.Error("a value of the current key needs resealing")
	}
	// The rotation is on disk before it seals.
	k2, err := Load(path)
	if err != nil || k2.Current() != 2 {
		t.Fatalf("reloaded: %v, current %d", err, k2.Current())
	}
	for _, s := range [][]byte{old, fresh} {
		if _, err := k2.Open(s, nil); err != nil {
			t.Error(err)
		}
	}
}

func TestLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets.keys")
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a keyring others may read: %v", err)
	}
	// Group read: for the process's own group only (a Secret mounted with
	// the pod's fsGroup); group write never.
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, -1, os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Errorf("a keyring of the process's group, mode 0640: %v", err)
	}
	if err := os.Chown(path, -1, os.Getgid()+4242); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a keyring another group may read: %v", err)
	}
	if err := os.Chown(path, -1, os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a keyring its group may write: %v", err)
	}
	for name, content := range map[string]string{
		"not json":        "{",
		"short key":       `{"current":1,"keys":{"1":"AAAA"}}`,
		"missing current": `{"current":2,"keys":{"1":"` + strings.Repeat("A", 43) + `="}}`,
		"bad id":          `{"current":1,"keys":{"x":"` + strings.Repeat("A", 43) + `="}}`,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

// TestReloadAfterRotation: a keyring rotated by another process (another
// replica's operator, a Secret updated in place) opens what the new key
// sealed, reading its file again.
func TestReloadAfterRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.keys")
	old, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := rotated.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := rotated.Seal([]byte("v"), []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := old.Open(sealed, []byte("b")); err != nil || string(got) != "v" {
		t.Fatalf("the older keyring: %q, %v", got, err)
	}
	if old.Current() != id {
		t.Errorf("after the reload the current key is %d, want %d", old.Current(), id)
	}
	// A value of a key no file holds: refused, naming the key.
	other, err := Load(filepath.Join(t.TempDir(), "other.keys"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Rotate(); err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.Seal([]byte("v"), []byte("b"))
	if _, err := old.Open(foreign, []byte("b")); !errors.Is(err, ErrOpen) || !strings.Contains(err.Error(), "key 3") {
		t.Errorf("a foreign key's value: %v", err)
	}
}

// TestLoadRefusesAnotherOwner: a keyring owned by another user is refused
// (its owner could read or replace the keys).
func TestLoadRefusesAnotherOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	path := filepath.Join(t.TempDir(), "secrets.keys")
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 4242, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "another user's") {
		t.Errorf("another user's keyring: %v", err)
	}
}
