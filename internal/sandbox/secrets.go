package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"

	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/internal/secrets"
	"github.com/evalbox/evalbox/pkg/client"
)

// SecretResolver opens a team's stored secrets (a secrets.Vault does). A
// name the team does not have is an error wrapping secrets.ErrNotFound.
type SecretResolver interface {
	Resolve(ctx context.Context, teamID string, names []string) (map[string]string, error)
}

// MaxSecrets bounds the secrets of a sandbox (given and referenced).
const MaxSecrets = limits.MaxSecrets

// MaxSecretBytes bounds a secret's value, as an env value is bounded.
const MaxSecretBytes = limits.MaxSecretBytes

// secretName is what a secret may be called: an environment variable name
// that every shell accepts.
var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ValidSecretName checks the name of a secret (a team's stored one too).
func ValidSecretName(name string) error {
	if !secretName.MatchString(name) {
		return errorf(client.CodeBadRequest, "secret name %q is not valid: letters, digits and _, not starting with a digit, at most 128", name)
	}
	return nil
}

// ValidSecretValue checks the value of a secret; the error never holds it.
func ValidSecretValue(name, value string) error {
	if len(value) > MaxSecretBytes {
		return errorf(client.CodeBadRequest, "secret %s: value is over %d KiB", name, MaxSecretBytes>>10)
	}
	if strings.ContainsRune(value, 0) {
		return errorf(client.CodeBadRequest, "secret %s: value has a NUL byte", name)
	}
	return nil
}

// validateSecrets checks a create's secrets and secret_refs: valid names,
// none given twice, none also in env (which of the two a process would see
// would be a guess), and within MaxSecrets together.
func validateSecrets(req client.CreateSandboxRequest) error {
	if n := len(req.Secrets) + len(req.SecretRefs); n > MaxSecrets {
		return errorf(client.CodeBadRequest, "a sandbox has at most %d secrets, got %d", MaxSecrets, n)
	}
	for name, value := range req.Secrets {
		if err := ValidSecretName(name); err != nil {
			return err
		}
		if err := ValidSecretValue(name, value); err != nil {
			return err
		}
		if _, ok := req.Env[name]; ok {
			return errorf(client.CodeBadRequest, "%s is in both env and secrets: give it once", name)
		}
	}
	seen := make(map[string]bool, len(req.SecretRefs))
	for _, name := range req.SecretRefs {
		if err := ValidSecretName(name); err != nil {
			return err
		}
		if seen[name] {
			return errorf(client.CodeBadRequest, "secret_refs names %s twice", name)
		}
		seen[name] = true
		if _, ok := req.Secrets[name]; ok {
			return errorf(client.CodeBadRequest, "%s is in both secrets and secret_refs: give it once", name)
		}
		if _, ok := req.Env[name]; ok {
			return errorf(client.CodeBadRequest, "%s is in both env and secret_refs: give it once", name)
		}
	}
	return nil
}

// resolveSecrets returns a (validated) create's secrets with its
// secret_refs opened: a new map, the request's left as it was.
func (s *Service) resolveSecrets(ctx context.Context, teamID string, req client.CreateSandboxRequest) (map[string]string, error) {
	if len(req.SecretRefs) == 0 {
		return req.Secrets, nil
	}
	if s.cfg.Secrets == nil {
		return nil, errorf(client.CodeNotImplemented, "this server keeps no team secrets: secret_refs cannot be used")
	}
	refs, err := s.cfg.Secrets.Resolve(ctx, teamID, req.SecretRefs)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil, errorf(client.CodeNotFound, "%v (PUT /v1/secrets/{name} stores one)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: team secrets: %w", err)
	}
	out := maps.Clone(req.Secrets)
	if out == nil {
		out = make(map[string]string, len(refs))
	}
	maps.Copy(out, refs)
	return out, nil
}
