package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/meter"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

// balanceTeam is the team a balance request is about: the caller's, or
// (admin key) the one ?team= names.
func balanceTeam(r *http.Request, p auth.Principal) (string, error) {
	t := r.URL.Query().Get("team")
	if t == "" || t == p.TeamID {
		return p.TeamID, nil
	}
	if err := requireAdmin(p); err != nil {
		return "", errorf(client.CodeForbidden, "the balance of another team needs an admin key")
	}
	return t, nil
}

func (s *Server) balanceOut(r *http.Request, teamID string) (client.Balance, error) {
	b, err := s.meter.Balance(r.Context(), teamID)
	if err != nil {
		return client.Balance{}, err
	}
	return client.Balance{TeamID: teamID, Balance: meter.FormatMoney(b.Available()), Ledger: meter.FormatMoney(b.Ledger),
		Running: meter.FormatMoney(b.Running), Billing: s.meter.Billing(), WarnedAt: b.WarnedAt}, nil
}

// balanceRequest is the team a balance or ledger request is about (the
// caller's, or the one an admin's ?team= names, which must exist), or
// false once it answered the refusal.
func (s *Server) balanceRequest(w http.ResponseWriter, r *http.Request, p auth.Principal) (string, bool) {
	if s.noMetering(w) {
		return "", false
	}
	team, err := balanceTeam(r, p)
	if err == nil {
		_, err = s.store.GetTeam(r.Context(), team)
		err = storeErr(err, "team "+team)
	}
	if err != nil {
		writeError(w, err)
		return "", false
	}
	return team, true
}

func (s *Server) getBalance(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	team, ok := s.balanceRequest(w, r, p)
	if !ok {
		return
	}
	out, err := s.balanceOut(r, team)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) topUp(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if s.noMetering(w) {
		return
	}
	if err := requireAdmin(p); err != nil {
		writeError(w, err)
		return
	}
	var req client.TopUpRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	kind := req.Kind
	if kind == "" {
		kind = store.LedgerTopUp
	}
	if kind != store.LedgerTopUp && kind != store.LedgerAdjust {
		writeError(w, errorf(client.CodeBadRequest, "kind must be top_up or adjust, got %q", req.Kind))
		return
	}
	neg := kind == store.LedgerAdjust && strings.HasPrefix(req.Amount, "-")
	amount, err := meter.ParseMoney(strings.TrimPrefix(req.Amount, "-"))
	if err != nil || (strings.HasPrefix(req.Amount, "-") && !neg) {
		writeError(w, errorf(client.CodeBadRequest, "amount must be a decimal of at most 9 decimals (negative only for an adjust), got %q", req.Amount))
		return
	}
	if amount == 0 || amount > meter.MaxEntry {
		writeError(w, errorf(client.CodeBadRequest, "amount must not be zero nor above %s", meter.FormatMoney(meter.MaxEntry)))
		return
	}
	if neg {
		amount = -amount
	}
	if len(req.Note) > 1024 {
		writeError(w, errorf(client.CodeBadRequest, "note is over 1024 bytes"))
		return
	}
	team := r.PathValue("id")
	setTarget(r.Context(), team)
	if b, err := s.meter.Balance(r.Context(), team); err == nil && b.Ledger > 1000*meter.MaxEntry {
		writeError(w, errorf(client.CodeConflict, "team %s's ledger is at its maximum", team))
		return
	}
	if _, err := s.metering.AddLedger(r.Context(), store.LedgerEntry{TeamID: team, Kind: kind, Amount: amount, Note: req.Note, Actor: p.KeyID}); err != nil {
		writeError(w, storeErr(err, "team "+team))
		return
	}
	out, err := s.balanceOut(r, team)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listLedger(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	team, ok := s.balanceRequest(w, r, p)
	if !ok {
		return
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		var err error
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 1000 {
			writeError(w, errorf(client.CodeBadRequest, "limit must be between 1 and 1000, got %q", v))
			return
		}
	}
	es, err := s.metering.ListLedger(r.Context(), team, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	out := client.LedgerList{Entries: make([]client.LedgerEntry, 0, len(es))}
	for _, e := range es {
		out.Entries = append(out.Entries, client.LedgerEntry{ID: e.ID, Kind: e.Kind, Amount: meter.FormatMoney(e.Amount),
			SandboxID: e.SandboxID, Note: e.Note, Actor: e.Actor, At: e.At})
	}
	writeJSON(w, http.StatusOK, out)
}
