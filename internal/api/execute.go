package api

import (
	"context"
	"io"
	"net/http"
	"sync"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// Bounds of POST /v1/execute (the body is also bounded by maxJSONBody).
const (
	maxExecuteScripts = 4096
	maxExecuteTimeout = 600.0
	defExecuteTimeout = 10.0
)

// languages maps an execute language to its default template, the path the
// script is written to and the command that runs it.
var languages = map[string]struct {
	template, path string
	argv           []string
}{
	client.LanguagePython: {"python", "/tmp/main.py", []string{"python3", "/tmp/main.py"}},
	client.LanguageBash:   {"base", "/tmp/main.sh", []string{"bash", "/tmp/main.sh"}},
}

// execute runs every script in its own fresh sandbox, up to the team's
// limits at a time, and answers with one result per script, in order.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.ExecuteRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	lang, ok := languages[req.Language]
	switch {
	case !ok:
		writeError(w, errorf(client.CodeBadRequest, "language must be python or bash, got %q", req.Language))
		return
	case len(req.Scripts) == 0:
		writeError(w, errorf(client.CodeBadRequest, "scripts is empty"))
		return
	case len(req.Scripts) > maxExecuteScripts:
		writeError(w, errorf(client.CodePayloadTooLarge, "%d scripts; at most %d per request", len(req.Scripts), maxExecuteScripts))
		return
	case req.Timeout < 0 || req.Timeout > maxExecuteTimeout:
		writeError(w, errorf(client.CodeBadRequest, "timeout must be in [0, %g] seconds (0: %g), got %g", maxExecuteTimeout, defExecuteTimeout, req.Timeout))
		return
	}
	spec := trial.Spec{Template: req.Template, Runtime: req.Runtime, Path: lang.path, Argv: lang.argv, Timeout: req.Timeout}
	if spec.Template == "" {
		spec.Template = lang.template
	}
	if spec.Timeout == 0 {
		spec.Timeout = defExecuteTimeout
	}
	team, err := s.svc.Team(r.Context(), p.TeamID)
	if err != nil {
		writeError(w, err)
		return
	}
	workers := min(len(req.Scripts), team.Limits.MaxSandboxes, team.Limits.MaxConcurrentExec)
	if workers <= 0 {
		writeError(w, errorf(client.CodeTooManySandboxes, "team %s may not run sandboxes (its limits are 0)", team.Name))
		return
	}
	// Every script's output is held until the last one ends: the first
	// chunks of all of them are reserved before any runs (429 when they
	// cannot be); output that outgrows the budget later is dropped and the
	// script's result says so, as for an exec.
	outs := make([][2]*outbuf.Buffer, len(req.Scripts))
	defer func() {
		for _, o := range outs {
			o[0].Release()
			o[1].Release()
		}
	}()
	for i := range outs {
		stdout, stderr, err := s.outputPair(outbuf.Truncate)
		if err != nil {
			writeError(w, err)
			return
		}
		outs[i] = [2]*outbuf.Buffer{stdout, stderr}
	}
	results, err := s.runScripts(r.Context(), p.TeamID, spec, req.Scripts, outs, workers)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = writeResults(w, results, outs)
}

// writeResults writes an ExecuteResponse whose results' output is in outs.
func writeResults(w io.Writer, results []client.ExecResult, outs [][2]*outbuf.Buffer) error {
	if _, err := io.WriteString(w, `{"results":[`); err != nil {
		return err
	}
	for i, res := range results {
		if i > 0 {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		if err := writeResult(w, res, outs[i][0], outs[i][1]); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "]}\n")
	return err
}

// runScripts runs the scripts with at most workers at a time. The first
// error that stops a script from running at all (bad template, the caller
// gone) stops the rest and is returned.
func (s *Server) runScripts(ctx context.Context, teamID string, spec trial.Spec, scripts []string, outs [][2]*outbuf.Buffer, workers int) ([]client.ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]client.ExecResult, len(scripts))
	next := make(chan int)
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				sp := spec
				sp.Script = scripts[i]
				stdout, stderr := outs[i][0], outs[i][1]
				sp.Output = func() (io.Writer, io.Writer) {
					// A fresh pair for each attempt.
					stdout.Reset()
					stderr.Reset()
					return stdout, stderr
				}
				out, err := s.trials.Run(ctx, teamID, sp)
				if err != nil {
					once.Do(func() { firstErr = err; cancel() })
					continue
				}
				if out.Phases == (trial.Phases{}) {
					// Every attempt failed (infra): no output of theirs is the result's.
					stdout.Reset()
					stderr.Reset()
				}
				markDropped(&out.Result, stdout, stderr)
				results[i] = out.Result
			}
		})
	}
feed:
	for i := range scripts {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return results, nil
}
