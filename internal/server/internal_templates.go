package server

import (
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/template"
)

// internalTemplates serves GET /v1/internal/templates/{digest} to node
// agents (authenticated by the node token, not by an API key) and passes
// every other request to api: a template's export stream (template.Export:
// its metadata and root filesystem as one deterministic tar, read from
// disk as it is sent), with its content digest in the
// Evalbox-Content-Digest header. It is not part of the public API
// (api/openapi.yaml does not list it).
func internalTemplates(api http.Handler, reg *template.Registry, nodeToken string, log *slog.Logger) http.Handler {
	want := []byte("Bearer " + nodeToken)
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.HandleFunc("GET /v1/internal/templates/{digest}", func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			log.Warn("template fetch refused: no or wrong node token", "remote", r.RemoteAddr)
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		digest := r.PathValue("digest")
		t, err := reg.ByDigest(digest)
		if errors.Is(err, template.ErrNotFound) {
			http.Error(w, "no such template", http.StatusNotFound)
			return
		}
		if err != nil {
			log.Error("template fetch", "template", digest, "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		cd, err := reg.ContentDigest(r.Context(), t.Digest)
		if err != nil {
			log.Error("template fetch: content digest", "template", digest, "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set(nodeapi.HeaderContentDigest, cd)
		if err := template.Export(r.Context(), w, t); err != nil {
			// Cut the connection: the node sees a failed read, never a
			// stream that merely ends early.
			log.Warn("template fetch cut short", "template", digest, "err", err)
			panic(http.ErrAbortHandler)
		}
		log.Info("template sent to a node", "template", digest, "remote", r.RemoteAddr)
	})
	return mux
}
