package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/pkg/client"
)

// Buffered answers (an exec without NDJSON, a wait, POST /v1/execute) hold
// command output in memory until the command ends. Every byte of it is
// reserved from the server's output budget (--output-memory-mb) as it
// arrives, and it is written out escaped straight from the buffers, never
// copied to a string or marshalled whole.

// budgetError is the answer to a request whose output the budget cannot
// hold.
func budgetError() error {
	return &apierr.Error{Code: client.CodeOutputBudgetExhausted, RetryAfter: 1, Err: outbuf.ErrExhausted,
		Message: "the server's memory for buffered command output is in use by other requests: " +
			"stream the output (Accept: application/x-ndjson), lower max_output_bytes, or retry later"}
}

// outputPair returns buffers for a command's stdout and stderr, or the
// budget error when not even their first chunks are free.
func (s *Server) outputPair(mode outbuf.Mode) (stdout, stderr *outbuf.Buffer, err error) {
	stdout, err = outbuf.New(s.outputBudget, mode)
	if err != nil {
		return nil, nil, budgetError()
	}
	stderr, err = outbuf.New(s.outputBudget, mode)
	if err != nil {
		stdout.Release()
		return nil, nil, budgetError()
	}
	return stdout, stderr, nil
}

// markDropped notes on res that output was dropped because the budget ran
// out while the command ran (Truncate buffers).
func markDropped(res *client.ExecResult, stdout, stderr *outbuf.Buffer) {
	if !stdout.Dropped() && !stderr.Dropped() {
		return
	}
	res.StdoutTruncated = res.StdoutTruncated || stdout.Dropped()
	res.StderrTruncated = res.StderrTruncated || stderr.Dropped()
	note := fmt.Sprintf("output past %d bytes (stdout) and %d bytes (stderr) was dropped: the server's memory for buffered output "+
		"was in use by other requests; stream the output (Accept: application/x-ndjson) to get all of it", stdout.Len(), stderr.Len())
	if res.Error == "" {
		res.Error = note
	} else {
		res.Error += "; " + note
	}
}

// resultPrefix is how encoding/json begins an ExecResult without output;
// writeResult replaces it with the escaped output.
const resultPrefix = `{"stdout":"","stderr":""`

// writeResult writes res with the buffers as its stdout and stderr, as
// encoding/json would have written it with them as strings (no newline).
func writeResult(w io.Writer, res client.ExecResult, stdout, stderr *outbuf.Buffer) error {
	res.Stdout, res.Stderr = "", ""
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	rest, ok := bytes.CutPrefix(b, []byte(resultPrefix))
	if !ok {
		return fmt.Errorf("api: ExecResult no longer marshals with prefix %s: %s", resultPrefix, b)
	}
	if _, err := io.WriteString(w, `{"stdout":`); err != nil {
		return err
	}
	if err := stdout.WriteJSONString(w); err != nil {
		return err
	}
	if _, err := io.WriteString(w, `,"stderr":`); err != nil {
		return err
	}
	if err := stderr.WriteJSONString(w); err != nil {
		return err
	}
	_, err = w.Write(rest)
	return err
}

// writeExecResult answers 200 with res and its buffered output.
func writeExecResult(w http.ResponseWriter, res client.ExecResult, stdout, stderr *outbuf.Buffer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if writeResult(w, res, stdout, stderr) == nil {
		_, _ = io.WriteString(w, "\n")
	}
}
