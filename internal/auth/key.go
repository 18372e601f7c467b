// Package auth implements API keys: their format and hashing, bearer
// header parsing, a caching Authenticator that resolves a key to its team,
// and the bootstrap of the first admin key.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// ErrUnauthorized: the request carries no key, a malformed key, or a key
// that is unknown or revoked.
var ErrUnauthorized = errors.New("unauthorized")

const (
	// KeyPrefix starts every API key.
	KeyPrefix = "eb_"
	// keyBodyLen base62 digits hold 32 random bytes: 62^43 > 2^256.
	keyBodyLen = 43
	// KeyLen is the length of an API key.
	KeyLen = len(KeyPrefix) + keyBodyLen
	// displayLen is how much of a key is kept (in clear) to recognise it:
	// the prefix and 8 random digits (~48 bits, leaving ~208 secret bits).
	displayLen = len(KeyPrefix) + 8
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// NewKey returns a new API key: "eb_" followed by 32 random bytes in
// base62 (43 digits), the short prefix shown to identify it, and the hash
// to store.
func NewKey() (secret, prefix, hash string) {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	n := new(big.Int).SetBytes(b[:])
	var out [KeyLen]byte
	copy(out[:], KeyPrefix)
	base, rem := big.NewInt(62), new(big.Int)
	for i := KeyLen - 1; i >= len(KeyPrefix); i-- {
		n.DivMod(n, base, rem)
		out[i] = base62[rem.Int64()]
	}
	secret = string(out[:])
	return secret, secret[:displayLen], HashKey(secret)
}

// HashKey returns the hex SHA-256 of an API key, the only form stored.
//
// A fast unsalted hash is right here, unlike for passwords: keys carry 256
// random bits, so neither brute force nor precomputed tables can invert the
// hash, and a slow KDF would only cost CPU on every request. Being
// deterministic, the hash is also the lookup index.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// wellFormed reports whether s has the shape of a key from NewKey, so that
// garbage is rejected without a database lookup.
func wellFormed(s string) bool {
	if len(s) != KeyLen || !strings.HasPrefix(s, KeyPrefix) {
		return false
	}
	for i := len(KeyPrefix); i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

// ParseBearer returns the token of an "Authorization: Bearer <token>"
// header value (scheme case-insensitive). A missing or malformed header is
// ErrUnauthorized.
func ParseBearer(header string) (string, error) {
	const scheme = "bearer "
	if len(header) < len(scheme) || !strings.EqualFold(header[:len(scheme)], scheme) {
		return "", fmt.Errorf("%w: missing bearer token", ErrUnauthorized)
	}
	tok := strings.TrimSpace(header[len(scheme):])
	if tok == "" || strings.ContainsAny(tok, " \t") {
		return "", fmt.Errorf("%w: malformed bearer token", ErrUnauthorized)
	}
	return tok, nil
}
