package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/internal/secrets"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// TeamSecrets keeps the teams' stored secrets (a secrets.Vault does).
type TeamSecrets interface {
	Put(ctx context.Context, teamID, name, value string) (bool, error)
	List(ctx context.Context, teamID string) ([]store.TeamSecret, error)
	Delete(ctx context.Context, teamID, name string) error
}

// maxSecretBody bounds the body of PUT /v1/secrets/{name}: a value of
// sandbox.MaxSecretBytes, JSON-escaped at worst (\u0000 is refused anyway).
const maxSecretBody = 6*sandbox.MaxSecretBytes + 1024

// The secrets are always the caller's team's: an admin key manages its
// own team's too, since a value is only ever opened into that team's
// sandboxes.

func (s *Server) putSecret(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if s.secrets == nil {
		writeError(w, errorf(client.CodeNotImplemented, "this server keeps no team secrets"))
		return
	}
	name := r.PathValue("name")
	if err := sandbox.ValidSecretName(name); err != nil {
		writeError(w, err)
		return
	}
	var req client.PutSecretRequest
	if err := decodeLimit(w, r, &req, maxSecretBody); err != nil {
		writeError(w, err)
		return
	}
	if err := sandbox.ValidSecretValue(name, req.Value); err != nil {
		writeError(w, err)
		return
	}
	created, err := s.secrets.Put(r.Context(), p.TeamID, name, req.Value)
	if err != nil {
		writeError(w, storeErr(err, "team "+p.TeamID))
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	list, err := s.secrets.List(r.Context(), p.TeamID)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, ts := range list {
		if ts.Name == name {
			writeJSON(w, status, teamSecret(ts))
			return
		}
	}
	// Deleted by another request meanwhile.
	writeError(w, errorf(client.CodeConflict, "secret %s was deleted while it was stored", name))
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	out := client.TeamSecretList{Secrets: []client.TeamSecret{}}
	if s.secrets == nil {
		writeJSON(w, http.StatusOK, out)
		return
	}
	list, err := s.secrets.List(r.Context(), p.TeamID)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, ts := range list {
		out.Secrets = append(out.Secrets, teamSecret(ts))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name := r.PathValue("name")
	if err := sandbox.ValidSecretName(name); err != nil {
		writeError(w, err)
		return
	}
	if s.secrets == nil {
		writeError(w, errorf(client.CodeNotFound, "secret %s not found", name))
		return
	}
	if err := s.secrets.Delete(r.Context(), p.TeamID, name); err != nil {
		if errors.Is(err, secrets.ErrNotFound) {
			err = errorf(client.CodeNotFound, "secret %s not found", name)
		}
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func teamSecret(ts store.TeamSecret) client.TeamSecret {
	return client.TeamSecret{Name: ts.Name, CreatedAt: ts.CreatedAt, UpdatedAt: ts.UpdatedAt}
}
