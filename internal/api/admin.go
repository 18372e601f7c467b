package api

import (
	"errors"
	"net/http"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// storeErr maps store sentinels to API errors.
func storeErr(err error, what string) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errorf(client.CodeNotFound, "%s not found", what)
	case errors.Is(err, store.ErrConflict):
		return errorf(client.CodeConflict, "%s already exists", what)
	}
	return err
}

// maxPerMinute bounds a team's rate limits (requests_per_minute,
// creates_per_minute): 100 000 a second.
const maxPerMinute = 6_000_000

func validLimits(l client.Limits) error {
	if l.MaxSandboxes < 0 || l.MaxSandboxes > 100000 {
		return errorf(client.CodeBadRequest, "max_sandboxes must be between 0 and 100000")
	}
	if l.MaxConcurrentExec < 0 || l.MaxConcurrentExec > 100000 {
		return errorf(client.CodeBadRequest, "max_concurrent_execs must be between 0 and 100000")
	}
	if l.MaxStorageMB < 0 || l.MaxStorageMB > 1<<30 {
		return errorf(client.CodeBadRequest, "max_storage_mb must be between 0 and %d", 1<<30)
	}
	if l.RequestsPerMinute < 0 || l.RequestsPerMinute > maxPerMinute {
		return errorf(client.CodeBadRequest, "requests_per_minute must be between 0 (the server's) and %d", maxPerMinute)
	}
	if l.CreatesPerMinute < 0 || l.CreatesPerMinute > maxPerMinute {
		return errorf(client.CodeBadRequest, "creates_per_minute must be between 0 (the server's) and %d", maxPerMinute)
	}
	return nil
}

func (s *Server) createTeam(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	var req client.CreateTeamRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if !template.ValidName(req.Name) {
		writeError(w, errorf(client.CodeBadRequest, "team name must be 1–63 of [a-z0-9._-], starting with a letter or digit"))
		return
	}
	limits := s.defaults
	if req.Limits != nil {
		if err := validLimits(*req.Limits); err != nil {
			writeError(w, err)
			return
		}
		limits = *req.Limits
		if limits.MaxStorageMB == 0 {
			limits.MaxStorageMB = s.defaults.MaxStorageMB
		}
	}
	t, err := s.store.CreateTeam(r.Context(), client.Team{Name: req.Name, Limits: limits})
	if err != nil {
		writeError(w, storeErr(err, "team "+req.Name))
		return
	}
	setTarget(r.Context(), t.ID)
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) listTeams(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	ts, err := s.store.ListTeams(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	if ts == nil {
		ts = []client.Team{}
	}
	writeJSON(w, http.StatusOK, client.TeamList{Teams: ts})
}

func (s *Server) getTeam(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	if !p.Admin && id != p.TeamID {
		writeError(w, errorf(client.CodeNotFound, "team %s not found", id))
		return
	}
	t, err := s.store.GetTeam(r.Context(), id)
	if err != nil {
		writeError(w, storeErr(err, "team "+id))
		return
	}
	if s.storage != nil {
		used, limit, err := s.storage.Usage(r.Context(), id)
		if err != nil {
			writeError(w, err)
			return
		}
		t.Usage = &client.TeamUsage{StorageBytes: used, MaxStorageBytes: max(limit, 0)}
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) updateTeam(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	var req client.UpdateTeamRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := validLimits(req.Limits); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	t, err := s.store.UpdateTeamLimits(r.Context(), id, req.Limits)
	if err != nil {
		writeError(w, storeErr(err, "team "+id))
		return
	}
	s.svc.ForgetTeam(id)
	s.auth.Invalidate()
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.CreateKeyRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Name == "" || len(req.Name) > 128 {
		writeError(w, errorf(client.CodeBadRequest, "name is required (at most 128 bytes)"))
		return
	}
	team := p.TeamID
	if req.TeamID != "" && req.TeamID != p.TeamID {
		if !p.Admin {
			writeError(w, errorf(client.CodeForbidden, "creating a key for another team needs an admin key"))
			return
		}
		team = req.TeamID
	}
	secret, prefix, hash := auth.NewKey()
	k, err := s.store.InsertKey(r.Context(), store.Key{TeamID: team, Name: req.Name, Prefix: prefix, Hash: hash})
	if err != nil {
		writeError(w, storeErr(err, "team "+team))
		return
	}
	setTarget(r.Context(), k.ID)
	out := k.API()
	out.Key = secret
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	team := p.TeamID
	if p.Admin {
		team = ""
	}
	ks, err := s.store.ListKeys(r.Context(), team)
	if err != nil {
		writeError(w, err)
		return
	}
	out := client.KeyList{Keys: make([]client.APIKey, 0, len(ks))}
	for _, k := range ks {
		out.Keys = append(out.Keys, k.API())
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	if id == p.KeyID {
		// A key revoking itself would lock its caller out mid-session (the
		// bootstrap admin key: every admin operation, until a restart).
		writeError(w, errorf(client.CodeConflict, "key %s is the key of this request; revoke it with another key", id))
		return
	}
	team := p.TeamID
	if p.Admin {
		team = ""
	}
	if _, err := s.store.RevokeKey(r.Context(), team, id); err != nil {
		writeError(w, storeErr(err, "key "+id))
		return
	}
	s.auth.Invalidate()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	pools, err := s.pools.Pools(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := client.PoolList{Pools: []client.Pool{}}
	for _, ps := range pools {
		k := ps.Spec
		name := ps.TemplateName
		if name == "" {
			name = k.Template
		}
		out.Pools = append(out.Pools, client.Pool{Template: name, Runtime: k.Runtime, CPU: k.Shape.CPU,
			MemoryMB: k.Shape.MemoryMB, DiskMB: k.Shape.DiskMB, Network: k.Shape.Network, Target: ps.Target, Ready: ps.Ready})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getCapacity(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	if s.capacity == nil {
		writeError(w, errorf(client.CodeNotFound, "this server reports no host capacity"))
		return
	}
	st, err := s.capacity.Capacity(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	free := st.Free()
	mib := func(b int64) int { return int(b >> 20) }
	avail := -1
	if st.MemoryAvailable >= 0 {
		avail = mib(st.MemoryAvailable)
	}
	writeJSON(w, http.StatusOK, client.Capacity{
		Pids:              client.CapacityAmount{Budget: int(st.Budget.Pids), Reserved: int(st.Reserved.Pids), Free: int(free.Pids)},
		MemoryMB:          client.CapacityAmount{Budget: mib(st.Budget.MemoryBytes), Reserved: mib(st.Reserved.MemoryBytes), Free: mib(free.MemoryBytes)},
		MemoryAvailableMB: avail, MemoryReserveMB: mib(st.MemoryReserve),
		Sandboxes: st.Sandboxes, Waiting: st.Waiting,
	})
}
