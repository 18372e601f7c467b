package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// watchKeepalive is how often a quiet watch stream says it is alive (a
// client and the proxies between notice a dead connection).
const watchKeepalive = 15 * time.Second

// watchDir streams the changes under a directory of the sandbox as NDJSON
// WatchEvents (GET /v1/sandboxes/{id}/files/watch).
func (s *Server) watchDir(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	recursive := false
	if v := q.Get("recursive"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, errorf(client.CodeBadRequest, "recursive must be true or false, got %q", v))
			return
		}
		recursive = b
	}
	dw, err := s.svc.WatchDir(r.Context(), p.TeamID, r.PathValue("id"), q.Get("path"), recursive)
	if err != nil {
		writeError(w, err)
		return
	}
	defer dw.Close()
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(ev client.WatchEvent) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	}
	w.Header().Set("Content-Type", client.ContentTypeNDJSON)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if send(client.WatchEvent{Type: client.WatchStart}) != nil {
		return
	}
	var sendErr error
	err = dw.Follow(r.Context(), watchKeepalive, func(ev client.WatchEvent) error {
		sendErr = send(ev)
		return sendErr
	})
	switch {
	case sendErr != nil || r.Context().Err() != nil:
		// The client left.
	case err != nil:
		_, detail, _ := errorDetail(err)
		_ = send(client.WatchEvent{Type: client.WatchError, Error: &detail})
	default:
		_ = send(client.WatchEvent{Type: client.WatchEnd})
	}
}
