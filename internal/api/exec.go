package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

const ndjson = "application/x-ndjson"

func wantsStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), ndjson)
}

// eventWriter turns output chunks into NDJSON ExecEvent lines, flushed as
// they are written. It is safe for concurrent use by the stdout and stderr
// writers.
type eventWriter struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
}

func newEventWriter(w http.ResponseWriter) *eventWriter {
	w.Header().Set("Content-Type", ndjson)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	return &eventWriter{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

func (e *eventWriter) event(ev client.ExecEvent) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.enc.Encode(ev); err != nil {
		return err
	}
	return e.rc.Flush()
}

type streamOf struct {
	e   *eventWriter
	typ string
}

func (s streamOf) Write(p []byte) (int, error) {
	if err := s.e.event(client.ExecEvent{Type: s.typ, Data: string(p)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// finish writes the last event: the result or the error.
func (e *eventWriter) finish(res client.ExecResult, err error) {
	if err != nil {
		_, detail, _ := errorDetail(err)
		_ = e.event(client.ExecEvent{Type: client.EventError, Error: &detail})
		return
	}
	_ = e.event(client.ExecEvent{Type: client.EventExit, Result: &res})
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.ExecRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	if wantsStream(r) {
		// Validate and admit before the 200 goes out, so that bad input
		// still gets its 4xx: the service checks everything before it
		// starts the process; a failure after that is an error event.
		var ew *eventWriter
		lazy := &lazyStream{w: w, ew: &ew}
		res, err := s.svc.Exec(r.Context(), p.TeamID, id, req, lazy.stream(client.EventStdout), lazy.stream(client.EventStderr))
		if ew == nil {
			if err != nil {
				writeError(w, err)
				return
			}
			ew = newEventWriter(w)
		}
		ew.finish(res, err)
		return
	}
	var stdout, stderr bytes.Buffer
	res, err := s.svc.Exec(r.Context(), p.TeamID, id, req, &stdout, &stderr)
	if err != nil {
		writeError(w, err)
		return
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	writeJSON(w, http.StatusOK, res)
}

// lazyStream starts the NDJSON response on the first output chunk.
type lazyStream struct {
	mu sync.Mutex
	w  http.ResponseWriter
	ew **eventWriter
}

func (l *lazyStream) stream(typ string) writerFunc {
	return func(p []byte) (int, error) {
		l.mu.Lock()
		if *l.ew == nil {
			*l.ew = newEventWriter(l.w)
		}
		ew := *l.ew
		l.mu.Unlock()
		return streamOf{e: ew, typ: typ}.Write(p)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.ExecRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	proc, err := s.svc.StartProcess(r.Context(), p.TeamID, r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, proc)
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	ps, err := s.svc.ListProcesses(r.Context(), p.TeamID, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, client.ProcessList{Processes: ps})
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	proc, err := s.svc.GetProcess(r.Context(), p.TeamID, r.PathValue("id"), r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, proc)
}

func (s *Server) waitProcess(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	ctx := r.Context()
	if t := r.URL.Query().Get("timeout"); t != "" {
		secs, err := strconv.ParseFloat(t, 64)
		if err != nil || secs <= 0 || secs > 24*3600 {
			writeError(w, errorf(client.CodeBadRequest, "timeout must be a number of seconds in (0, 86400], got %q", t))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(secs*float64(time.Second)))
		defer cancel()
	}
	var stdout, stderr bytes.Buffer
	res, err := s.svc.AttachProcess(ctx, p.TeamID, r.PathValue("id"), r.PathValue("pid"), &stdout, &stderr)
	if err != nil {
		if ctx.Err() != nil && r.Context().Err() == nil {
			writeError(w, errorf(client.CodeTimeout, "process %s is still running", r.PathValue("pid")))
			return
		}
		writeError(w, err)
		return
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) streamProcess(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var ew *eventWriter
	lazy := &lazyStream{w: w, ew: &ew}
	res, err := s.svc.AttachProcess(r.Context(), p.TeamID, r.PathValue("id"), r.PathValue("pid"), lazy.stream(client.EventStdout), lazy.stream(client.EventStderr))
	if ew == nil {
		if err != nil {
			writeError(w, err)
			return
		}
		ew = newEventWriter(w)
	}
	ew.finish(res, err)
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.SignalRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := s.svc.SignalProcess(r.Context(), p.TeamID, r.PathValue("id"), r.PathValue("pid"), req.Signal); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := s.svc.SignalProcess(r.Context(), p.TeamID, r.PathValue("id"), r.PathValue("pid"), "KILL"); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
