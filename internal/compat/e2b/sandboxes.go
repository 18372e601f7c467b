package e2b

import (
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// Template aliases: the names the SDKs ask for by default, and evalbox's
// templates they mean.
var templateAliases = map[string]string{
	"code-interpreter-v1": "code-interpreter",
}

// allTraffic is what the SDKs send for "every address" in network lists.
const allTraffic = "0.0.0.0/0"

// createRequest is the body of POST /v2/sandboxes. Fields of features
// evalbox lacks are read so that asking for them is refused, not ignored.
type createRequest struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int                    `json:"timeout"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *networkConfig          `json:"network"`
	AutoPause           *bool                   `json:"autoPause"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	MCP                 map[string]any          `json:"mcp"`
	VolumeMounts        []any                   `json:"volumeMounts"`
}

type networkConfig struct {
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
	MaskRequestHost    string   `json:"maskRequestHost"`
	DNSServers         []string `json:"dnsServers"`
	EgressProxy        any      `json:"egressProxy"`
	Rules              any      `json:"rules"`
}

// sandboxBody is E2B's Sandbox: the answer of create and connect.
type sandboxBody struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// listedSandbox is E2B's ListedSandbox and, with the detail fields,
// SandboxDetail.
type listedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`

	// SandboxDetail only.
	EnvdAccessToken     string  `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool   `json:"allowInternetAccess,omitempty"`
	Domain              *string `json:"domain,omitempty"`
}

func (h *Handler) createSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req createRequest
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	creq, err := h.translateCreate(req)
	if err != nil {
		h.writeError(w, err)
		return
	}
	sb, err := h.cfg.Sandboxes.Create(r.Context(), p.TeamID, creq)
	if err != nil {
		h.writeError(w, err)
		return
	}
	if h.cfg.Created != nil {
		h.cfg.Created(r.Context(), sb.ID)
	}
	body, err := h.sandboxBody(r, sb, req.TemplateID)
	if err != nil {
		h.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, body)
}

// translateCreate maps an E2B create onto evalbox's; what evalbox cannot
// do is a 400 or 501 that says so.
func (h *Handler) translateCreate(req createRequest) (client.CreateSandboxRequest, error) {
	tmpl := req.TemplateID
	if tmpl == "" {
		tmpl = "base"
	}
	if isSnapshotID(tmpl) {
		// The snapshot's template, shape and network: one asked for is
		// refused, not dropped (allow_internet_access true, the SDKs'
		// default, asks for nothing).
		switch {
		case req.AllowInternetAccess != nil && !*req.AllowInternetAccess, req.Network != nil:
			return client.CreateSandboxRequest{}, errorf(client.CodeBadRequest,
				"a sandbox made from snapshot %s has its network: leave allow_internet_access and network unset", tmpl)
		case req.AutoPause != nil && *req.AutoPause, req.AutoResume != nil && req.AutoResume.Enabled, len(req.MCP) > 0, len(req.VolumeMounts) > 0:
			return client.CreateSandboxRequest{}, errorf(client.CodeNotImplemented, "autoPause, autoResume, mcp and volumeMounts are not supported")
		}
		out := client.CreateSandboxRequest{Snapshot: tmpl, Metadata: req.Metadata, Env: req.EnvVars}
		if req.Timeout != nil {
			if *req.Timeout <= 0 {
				return out, errorf(client.CodeBadRequest, "timeout %d: want a positive number of seconds", *req.Timeout)
			}
			out.Timeout = *req.Timeout
		}
		return out, nil
	}
	name, tag, err := templateRef(tmpl)
	if err != nil {
		return client.CreateSandboxRequest{}, err
	}
	out := client.CreateSandboxRequest{Template: evalboxRef(name, tag), Metadata: req.Metadata, Env: req.EnvVars}
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			return out, errorf(client.CodeBadRequest, "timeout %d: want a positive number of seconds", *req.Timeout)
		}
		out.Timeout = *req.Timeout
	}
	switch {
	case req.AutoPause != nil && *req.AutoPause:
		return out, errorf(client.CodeNotImplemented, "autoPause: evalbox does not pause sandboxes at their timeout (pause them with POST /sandboxes/{id}/pause)")
	case req.AutoResume != nil && req.AutoResume.Enabled:
		return out, errorf(client.CodeNotImplemented, "autoResume: evalbox does not resume sandboxes on traffic (connect resumes one)")
	case len(req.MCP) > 0:
		return out, errorf(client.CodeNotImplemented, "mcp: evalbox has no MCP gateway")
	case len(req.VolumeMounts) > 0:
		return out, errorf(client.CodeNotImplemented, "volumeMounts: evalbox has no volumes")
	}
	netw, err := translateNetwork(req.AllowInternetAccess, req.Network)
	if err != nil {
		return out, err
	}
	out.Network = netw
	return out, nil
}

// translateNetwork maps allow_internet_access and network onto evalbox's
// network: internet access by default, as on E2B; none when it is off;
// and, when denyOut holds every address, rules whose allow list is
// allowOut (E2B's allowOut wins over its denyOut; evalbox's deny wins, so
// only that form maps exactly).
func translateNetwork(internet *bool, n *networkConfig) (client.NetworkSpec, error) {
	if n != nil {
		switch {
		case n.AllowPublicTraffic != nil && *n.AllowPublicTraffic:
			return client.NetworkSpec{}, errorf(client.CodeNotImplemented,
				"network.allowPublicTraffic: a port is public only when marked so (PUT /v1/sandboxes/{id}/ports); port traffic takes the trafficAccessToken")
		case n.MaskRequestHost != "", len(n.DNSServers) > 0, n.EgressProxy != nil, n.Rules != nil:
			return client.NetworkSpec{}, errorf(client.CodeNotImplemented,
				"network: maskRequestHost, dnsServers, egressProxy and rules are not supported")
		}
		if len(n.AllowOut) > 0 || len(n.DenyOut) > 0 {
			if internet != nil && !*internet && len(n.AllowOut) > 0 {
				return client.NetworkSpec{}, errorf(client.CodeBadRequest, "allow_internet_access false with network.allowOut: choose one")
			}
			if !slices.Contains(n.DenyOut, allTraffic) {
				return client.NetworkSpec{}, errorf(client.CodeNotImplemented,
					"network.denyOut without %s: evalbox's rules are allow lists (deny %s and list what is allowed in allowOut)", allTraffic, allTraffic)
			}
			if len(n.AllowOut) == 0 {
				return client.Network(client.NetworkNone), nil
			}
			deny := slices.DeleteFunc(slices.Clone(n.DenyOut), func(s string) bool { return s == allTraffic })
			return client.NetworkSpec{Mode: client.NetworkRules, Allow: n.AllowOut, Deny: deny}, nil
		}
	}
	if internet != nil && !*internet {
		return client.Network(client.NetworkNone), nil
	}
	return client.Network(client.NetworkOutbound), nil
}

// sandboxBody is sb as E2B's Sandbox, with its tokens.
func (h *Handler) sandboxBody(r *http.Request, sb client.Sandbox, alias string) (sandboxBody, error) {
	envd, err := h.envdToken(r.Context(), sb.ID)
	if err != nil {
		return sandboxBody{}, err
	}
	traffic, err := h.trafficToken(r.Context(), sb)
	if err != nil {
		return sandboxBody{}, err
	}
	b := sandboxBody{TemplateID: e2bRef(sb.Template), SandboxID: sb.ID, ClientID: clientID(sb), EnvdVersion: EnvdVersion,
		EnvdAccessToken: envd, TrafficAccessToken: &traffic, Domain: h.domain()}
	if alias != sb.Template {
		b.Alias = alias
	}
	return b, nil
}

func (h *Handler) domain() *string {
	if h.cfg.Domain == "" {
		return nil
	}
	d := h.cfg.Domain
	return &d
}

// clientID is E2B's clientID (its node): the sandbox's node.
func clientID(sb client.Sandbox) string {
	if sb.NodeID != "" {
		return sb.NodeID
	}
	return "evalbox"
}

func listed(sb client.Sandbox) listedSandbox {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	state := "running"
	if sb.PausedAt != nil {
		state = "paused"
	}
	return listedSandbox{TemplateID: e2bRef(sb.Template), SandboxID: sb.ID, ClientID: clientID(sb),
		StartedAt: sb.CreatedAt, EndAt: sb.ExpiresAt, CPUCount: int(math.Ceil(sb.CPU)), MemoryMB: sb.MemoryMB,
		DiskSizeMB: sb.DiskMB, State: state, EnvdVersion: EnvdVersion, Metadata: md}
}

// running returns the team's sandbox id while it runs; an ended one is
// gone, as on E2B (404).
func (h *Handler) running(r *http.Request, p auth.Principal, id string) (client.Sandbox, error) {
	sb, err := h.cfg.Sandboxes.Get(r.Context(), p.TeamID, id)
	if err == nil && sb.State != client.StateRunning {
		err = errorf(client.CodeNotFound, "sandbox %s not found (it ended: %s)", id, sb.EndReason)
	}
	return sb, err
}

func (h *Handler) getSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	sb, err := h.running(r, p, r.PathValue("id"))
	if err != nil {
		h.writeError(w, err)
		return
	}
	envd, err := h.envdToken(r.Context(), sb.ID)
	if err != nil {
		h.writeError(w, err)
		return
	}
	d := listed(sb)
	d.EnvdAccessToken = envd
	internet := sb.Network != client.NetworkNone
	d.AllowInternetAccess = &internet
	d.Domain = h.domain()
	writeJSON(w, http.StatusOK, d)
}

func (h *Handler) killSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	if _, err := h.running(r, p, id); err != nil {
		h.writeError(w, err)
		return
	}
	if err := h.cfg.Sandboxes.Delete(r.Context(), p.TeamID, id); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	if req.Timeout == nil || *req.Timeout <= 0 {
		h.writeError(w, errorf(client.CodeBadRequest, "timeout: want a positive number of seconds"))
		return
	}
	if _, err := h.cfg.Sandboxes.SetTimeout(r.Context(), p.TeamID, r.PathValue("id"), *req.Timeout); err != nil {
		h.writeError(w, notRunningIsGone(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connectSandbox answers a running sandbox with its tokens (another
// process of the caller's connects to it by id), resuming it when it is
// paused and extending its timeout when asked.
func (h *Handler) connectSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Timeout *int  `json:"timeout"`
		Memory  *bool `json:"memory"`
	}
	if err := decode(w, r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	id := r.PathValue("id")
	sb, err := h.running(r, p, id)
	if err != nil {
		h.writeError(w, err)
		return
	}
	if sb.PausedAt != nil {
		if err := memoryOnly(req.Memory, "a resume"); err != nil {
			h.writeError(w, err)
			return
		}
		if sb, err = h.resumeWithTimeout(r, p, id, req.Timeout); err != nil {
			h.writeError(w, err)
			return
		}
	} else if req.Timeout != nil {
		if *req.Timeout <= 0 {
			h.writeError(w, errorf(client.CodeBadRequest, "timeout: want a positive number of seconds"))
			return
		}
		if sb, err = h.cfg.Sandboxes.SetTimeout(r.Context(), p.TeamID, id, *req.Timeout); err != nil {
			h.writeError(w, notRunningIsGone(err))
			return
		}
	}
	body, err := h.sandboxBody(r, sb, sb.Template)
	if err != nil {
		h.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// notRunningIsGone answers an ended sandbox as E2B does: not found.
func notRunningIsGone(err error) error {
	var e *apierr.Error
	if errors.As(err, &e) && e.Code == client.CodeSandboxNotRunning {
		return errorf(client.CodeNotFound, "%s", e.Message)
	}
	return err
}

// listSandboxes serves GET /v2/sandboxes: the team's running and paused
// sandboxes (by state), filtered by metadata, a page at a time
// (limit, nextToken; the next page's token in x-next-token).
func (h *Handler) listSandboxes(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	md, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		h.writeError(w, err)
		return
	}
	running, paused := true, true
	if st := q.Get("state"); st != "" {
		running, paused = false, false
		for s := range strings.SplitSeq(st, ",") {
			switch s {
			case "running":
				running = true
			case "paused":
				paused = true
			default:
				h.writeError(w, errorf(client.CodeBadRequest, "state %q: want running or paused", s))
				return
			}
		}
	}
	limit, offset, err := page(q)
	if err != nil {
		h.writeError(w, err)
		return
	}
	out := []listedSandbox{}
	if running || paused {
		sbs, err := h.cfg.Sandboxes.List(r.Context(), p.TeamID, md, false)
		if err != nil {
			h.writeError(w, err)
			return
		}
		sbs = slices.DeleteFunc(sbs, func(sb client.Sandbox) bool {
			return (sb.PausedAt != nil && !paused) || (sb.PausedAt == nil && !running)
		})
		if q.Get("order") == "desc" {
			slices.Reverse(sbs)
		}
		if offset < len(sbs) {
			sbs = sbs[offset:]
			if len(sbs) > limit {
				w.Header().Set("x-next-token", strconv.Itoa(offset+limit))
				sbs = sbs[:limit]
			}
			for _, sb := range sbs {
				out = append(out, listed(sb))
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// page reads a list's paging: limit (1 to 1000, default 100) and the
// nextToken a previous page gave (an offset).
func page(q url.Values) (limit, offset int, err error) {
	limit = 100
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > 1000 {
			return 0, 0, errorf(client.CodeBadRequest, "limit %q: want 1 to 1000", l)
		}
	}
	if t := q.Get("nextToken"); t != "" {
		if offset, err = strconv.Atoi(t); err != nil || offset < 0 {
			return 0, 0, errorf(client.CodeBadRequest, "nextToken %q: not one this server gave", t)
		}
	}
	return limit, offset, nil
}

// listSandboxesV1 serves the older GET /sandboxes: running sandboxes, all.
func (h *Handler) listSandboxesV1(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	md, err := metadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		h.writeError(w, err)
		return
	}
	sbs, err := h.cfg.Sandboxes.List(r.Context(), p.TeamID, md, false)
	if err != nil {
		h.writeError(w, err)
		return
	}
	out := make([]listedSandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, listed(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

// metadataFilter decodes the SDKs' metadata query value: a query string
// of percent-encoded keys and values (k1=v1&k2=v2), itself the value of
// the metadata parameter.
func metadataFilter(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(v)
	if err != nil {
		return nil, errorf(client.CodeBadRequest, "metadata %q: want k1=v1&k2=v2", v)
	}
	md := make(map[string]string, len(vals))
	for k, vs := range vals {
		kk, err1 := url.PathUnescape(k)
		vv, err2 := url.PathUnescape(vs[len(vs)-1])
		if err1 != nil || err2 != nil {
			return nil, errorf(client.CodeBadRequest, "metadata %q: bad percent-encoding", v)
		}
		md[kk] = vv
	}
	return md, nil
}

func (h *Handler) metrics(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if _, err := h.running(r, p, r.PathValue("id")); err != nil {
		h.writeError(w, err)
		return
	}
	h.writeError(w, errorf(client.CodeNotImplemented, "evalbox does not collect sandbox metrics yet"))
}
