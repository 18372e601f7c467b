package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/sandbox"
	"github.com/evalbox/evalbox/pkg/client"
)

const ndjson = "application/x-ndjson"

func wantsStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), ndjson)
}

// eventWriter turns output chunks into NDJSON ExecEvent lines, flushed as
// they are written. The agent client writes stdout and stderr from one
// goroutine, so it needs no lock.
type eventWriter struct {
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
	if err := e.enc.Encode(ev); err != nil {
		return err
	}
	return e.rc.Flush()
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

// lazyStream starts the NDJSON response with the first output chunk, so
// that a call failing before any output still gets its HTTP error status.
type lazyStream struct {
	w  http.ResponseWriter
	ew *eventWriter
}

func (l *lazyStream) writer() *eventWriter {
	if l.ew == nil {
		l.ew = newEventWriter(l.w)
	}
	return l.ew
}

// chunkWriter emits the chunks of one stream as events. JSON strings carry
// text: a multi-byte UTF-8 character cut between two chunks is held back
// until its end arrives, so it is never replaced by U+FFFD.
type chunkWriter struct {
	l       *lazyStream
	typ     string
	pending []byte
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	buf := append(c.pending, p...)
	cut := completeUTF8(buf)
	c.pending = append(c.pending[:0:0], buf[cut:]...)
	if cut == 0 {
		return len(p), nil
	}
	if err := c.l.writer().event(client.ExecEvent{Type: c.typ, Data: string(buf[:cut])}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// flush emits what is held back (at the end of the stream).
func (c *chunkWriter) flush() {
	if len(c.pending) > 0 {
		_ = c.l.writer().event(client.ExecEvent{Type: c.typ, Data: string(c.pending)})
		c.pending = nil
	}
}

// completeUTF8 returns the length of the longest prefix of b that does not
// end inside a UTF-8 sequence (invalid bytes count as complete).
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}

// stream answers with NDJSON events of run's output, then its result.
func stream(w http.ResponseWriter, run func(stdout, stderr io.Writer) (client.ExecResult, error)) {
	l := &lazyStream{w: w}
	out := &chunkWriter{l: l, typ: client.EventStdout}
	errw := &chunkWriter{l: l, typ: client.EventStderr}
	res, err := run(out, errw)
	out.flush()
	errw.flush()
	if l.ew == nil && err != nil {
		writeError(w, err)
		return
	}
	l.writer().finish(res, err)
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.ExecRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	if wantsStream(r) {
		// Validation and admission happen before any output, so bad input
		// still gets its 4xx; a failure after output is an error event.
		stream(w, func(stdout, stderr io.Writer) (client.ExecResult, error) {
			return s.svc.Exec(r.Context(), p.TeamID, id, req, stdout, stderr)
		})
		return
	}
	// The output is held until the command ends. When the budget cannot
	// hold even its first bytes, nothing runs (429); when it runs out while
	// the command runs, the command runs on to its end and the rest of its
	// output is dropped (the result says so), since the command cannot be
	// undone.
	stdout, stderr, err := s.outputPair(outbuf.Truncate)
	if err != nil {
		writeError(w, err)
		return
	}
	defer stdout.Release()
	defer stderr.Release()
	res, err := s.svc.Exec(r.Context(), p.TeamID, id, req, stdout, stderr)
	if err != nil {
		writeError(w, err)
		return
	}
	markDropped(&res, stdout, stderr)
	writeExecResult(w, res, stdout, stderr)
}

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
	// A wait can be asked again: when the budget runs out it answers 429
	// (the process runs on, its output stays in the sandbox).
	stdout, stderr, err := s.outputPair(outbuf.Fail)
	if err != nil {
		writeError(w, err)
		return
	}
	defer stdout.Release()
	defer stderr.Release()
	res, err := s.svc.AttachProcess(ctx, p.TeamID, r.PathValue("id"), r.PathValue("pid"), stdout, stderr)
	if err != nil {
		if errors.Is(err, outbuf.ErrExhausted) {
			writeError(w, budgetError())
			return
		}
		if ctx.Err() != nil && r.Context().Err() == nil {
			writeError(w, errorf(client.CodeTimeout, "process %s is still running", r.PathValue("pid")))
			return
		}
		writeError(w, err)
		return
	}
	writeExecResult(w, res, stdout, stderr)
}

func (s *Server) streamProcess(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	stream(w, func(stdout, stderr io.Writer) (client.ExecResult, error) {
		return s.svc.AttachProcess(r.Context(), p.TeamID, r.PathValue("id"), r.PathValue("pid"), stdout, stderr)
	})
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

// writeStdin serves POST …/processes/{pid}/stdin: the body (raw bytes, at
// most sandbox.MaxStdinBytes) to the process's stdin, which ?close=true
// then closes.
func (s *Server) writeStdin(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	closeAfter := false
	switch v := r.URL.Query().Get("close"); v {
	case "", "false":
	case "true":
		closeAfter = true
	default:
		writeError(w, errorf(client.CodeBadRequest, "close=%q: want true or false", v))
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, sandbox.MaxStdinBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = errorf(client.CodePayloadTooLarge, "stdin is over %d bytes a request", sandbox.MaxStdinBytes)
		}
		writeError(w, err)
		return
	}
	if err := s.svc.WriteStdin(r.Context(), p.TeamID, r.PathValue("id"), r.PathValue("pid"), data, closeAfter); err != nil {
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
