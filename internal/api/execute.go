package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"sync"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/lang"
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

// executeDir is where a script is written (internal/lang names the file).
// An interpreted language's script runs from the template's working
// directory, as /tmp/FILE; a compiled one's is compiled and run with
// executeDir as its working directory, its product beside it.
const executeDir = "/tmp"

// executeCompileTimeout bounds a compiled language's compile, apart from
// the request's timeout, which is the run's.
const executeCompileTimeout = 30.0

// executeSpec is the trial of script in language l: written, compiled (a
// trial.Spec's Prepare, in the same sandbox) and run as the language
// table says.
func executeSpec(l lang.Language, script string) trial.Spec {
	file, class := l.SourceFile(script)
	sp := trial.Spec{Template: l.Template, Script: script, Env: l.Env}
	if !l.Compiled() {
		sp.Path = path.Join(executeDir, file)
		sp.Argv = l.RunArgv(sp.Path, class)
		return sp
	}
	sp.Cwd, sp.Path = executeDir, file
	sp.Prepare, sp.PrepareTimeout = l.CompileArgv(file, nil), executeCompileTimeout
	sp.Argv = l.RunArgv(file, class)
	return sp
}

// compileFailure says on a compile's result why the program did not run.
func compileFailure(res *client.ExecResult, argv []string, timeout float64) {
	why := ""
	switch res.Status {
	case client.StatusTimedOut:
		why = fmt.Sprintf("the compile timed out after %gs", timeout)
	case client.StatusKilled:
		why = fmt.Sprintf("the compile was killed (signal %d)", res.Signal)
		if res.Error != "" {
			why += ": " + res.Error
		}
	default:
		why = fmt.Sprintf("compile error: %s exited %d", argv[0], res.ExitCode)
	}
	res.Error = why + "; the program did not run"
}

// execute runs every script in its own fresh sandbox, up to the team's
// limits at a time, and answers with one result per script, in order.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.ExecuteRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	l, ok := lang.LookupExact(req.Language)
	switch {
	case !ok:
		writeError(w, errorf(client.CodeBadRequest, "language must be one of %s (docs/languages.md), got %q", strings.Join(lang.AllNames(), ", "), req.Language))
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
	timeout := req.Timeout
	if timeout == 0 {
		timeout = defExecuteTimeout
	}
	specOf := func(script string) trial.Spec {
		sp := executeSpec(l, script)
		sp.Runtime, sp.Timeout = req.Runtime, timeout
		if req.Template != "" {
			sp.Template = req.Template
		}
		return sp
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
	results, err := s.runScripts(r.Context(), p.TeamID, specOf, req.Scripts, outs, workers)
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

// runScripts runs the scripts, each as specOf makes its trial, with at
// most workers at a time. The first error that stops a script from running
// at all (bad template, the caller gone) stops the rest and is returned.
// A compiled script that did not compile has its compile's result (its
// exit code and output) with Error saying so.
func (s *Server) runScripts(ctx context.Context, teamID string, specOf func(script string) trial.Spec, scripts []string, outs [][2]*outbuf.Buffer, workers int) ([]client.ExecResult, error) {
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
				sp := specOf(scripts[i])
				stdout, stderr := outs[i][0], outs[i][1]
				sp.Output = func() (io.Writer, io.Writer) {
					// A fresh pair for each attempt, and for the run
					// after a compile: the compile's output is the
					// result's only when the program did not run.
					stdout.Reset()
					stderr.Reset()
					return stdout, stderr
				}
				if sp.Prepare != nil {
					sp.PrepareOutput = sp.Output
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
				if out.PrepareFailed {
					compileFailure(&out.Result, sp.Prepare, sp.PrepareTimeout)
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
