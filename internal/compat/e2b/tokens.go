package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"fmt"

	"github.com/evalbox/evalbox/pkg/client"
)

// secretName names the server secret the tokens derive from.
const secretName = "e2b-tokens"

// Token purposes: one key, distinct messages.
const (
	purposeEnvd    = "e2b-envd"
	purposeTraffic = "e2b-traffic"
)

// secret returns the server secret, read once.
func (h *Handler) secret(ctx context.Context) ([]byte, error) {
	h.keyMu.Lock()
	defer h.keyMu.Unlock()
	if h.key != nil {
		return h.key, nil
	}
	k, err := h.cfg.Secrets.ServerSecret(ctx, secretName)
	if err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	h.key = k
	return k, nil
}

var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// derive is the token of purpose for the sandbox: an HMAC of the server
// secret, so that it can be handed out again (connect) without being
// stored, and is worth nothing for another sandbox.
func derive(key []byte, purpose string, parts ...string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose))
	for _, p := range parts {
		m.Write([]byte{0})
		m.Write([]byte(p))
	}
	return "ebx_" + tokenEncoding.EncodeToString(m.Sum(nil))
}

// envdToken is the sandbox's envdAccessToken (X-Access-Token): it grants
// what the team's API key grants, on this sandbox only.
func (h *Handler) envdToken(ctx context.Context, id string) (string, error) {
	k, err := h.secret(ctx)
	if err != nil {
		return "", err
	}
	return derive(k, purposeEnvd, id), nil
}

// trafficToken is the sandbox's trafficAccessToken: like the traffic token
// of its port URLs, and derived from that token's hash, so that rotating
// the one rotates the other.
func (h *Handler) trafficToken(ctx context.Context, sb client.Sandbox) (string, error) {
	k, err := h.secret(ctx)
	if err != nil {
		return "", err
	}
	return derive(k, purposeTraffic, sb.ID, sb.TrafficTokenHash), nil
}

// equal compares tokens in constant time.
func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
