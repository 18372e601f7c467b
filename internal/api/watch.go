package api

import (
	"encoding/json"
	"errors"
	"io"
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
	type next struct {
		ev  client.WatchEvent
		err error
	}
	events := make(chan next)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			ev, err := dw.Next()
			select {
			case events <- next{ev, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(ev client.WatchEvent) bool {
		return enc.Encode(ev) == nil && rc.Flush() == nil
	}
	w.Header().Set("Content-Type", client.ContentTypeNDJSON)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if !send(client.WatchEvent{Type: client.WatchStart}) {
		return
	}
	tick := time.NewTicker(watchKeepalive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if !send(client.WatchEvent{Type: client.WatchKeepalive}) {
				return
			}
		case n := <-events:
			switch {
			case errors.Is(n.err, io.EOF):
				send(client.WatchEvent{Type: client.WatchEnd})
				return
			case n.err != nil:
				if r.Context().Err() == nil {
					_, detail, _ := errorDetail(n.err)
					send(client.WatchEvent{Type: client.WatchError, Error: &detail})
				}
				return
			}
			if !send(n.ev) {
				return
			}
			tick.Reset(watchKeepalive)
		}
	}
}
