package sandboxfusion

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/interpreter"
	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/internal/trial"
	"github.com/evalbox/evalbox/pkg/client"
)

// run_jupyter runs its cells, one after the other, on one kernel of a fresh
// sandbox of the built-in code-interpreter template (internal/interpreter's
// server, reached through the sandbox's port as port URLs reach it).

// Sandboxes is what run_jupyter needs of the sandbox service.
type Sandboxes interface {
	Create(ctx context.Context, teamID string, req client.CreateSandboxRequest) (client.Sandbox, error)
	Delete(ctx context.Context, teamID, id string) error
	trial.FileStore
}

// Bounds of run_jupyter.
const (
	jupyterTemplate     = "code-interpreter"
	defaultTotalTimeout = 45.0
	maxCells            = 1024
	// jupyterCwd is the kernel's working directory (the interpreter's
	// default context), where relative files go.
	jupyterCwd = "/home/user"
	// maxCellOutput bounds what one cell's lines may hold, maxRunOutput
	// all the cells' of a run (past it the run is a SandboxError).
	maxCellOutput = 8 << 20
	maxRunOutput  = 64 << 20
)

// runJupyterRequest is SandboxFusion's RunJupyterRequest.
type runJupyterRequest struct {
	Cells        []string           `json:"cells"`
	CellTimeout  *float64           `json:"cell_timeout"`
	TotalTimeout *float64           `json:"total_timeout"`
	Kernel       *string            `json:"kernel"`
	Files        map[string]*string `json:"files"`
	FetchFiles   []string           `json:"fetch_files"`
}

// cellRunResult is SandboxFusion's CellRunResult: a cell's streams, its
// displays (MIME bundles of execute_result and display_data) and errors
// (Jupyter's ename, evalue, traceback).
type cellRunResult struct {
	Stdout  string           `json:"stdout"`
	Stderr  string           `json:"stderr"`
	Display []map[string]any `json:"display"`
	Error   []map[string]any `json:"error"`
}

// runJupyterResponse is SandboxFusion's RunJupyterResponse.
type runJupyterResponse struct {
	Status          string            `json:"status"`
	Message         string            `json:"message"`
	Driver          *commandRunResult `json:"driver"`
	Cells           []cellRunResult   `json:"cells"`
	ExecutorPodName *string           `json:"executor_pod_name"`
	Files           map[string]string `json:"files"`
}

func (h *Handler) runJupyter(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req runJupyterRequest
	if !decode(w, r, &req) {
		return
	}
	in, verr := checkJupyter(req)
	if verr != nil {
		writeValidation(w, verr)
		return
	}
	// The cells' output and the fetched files are reserved from the
	// server's output budget until the answer is written.
	tally := outbuf.NewTally(h.cfg.Output)
	defer tally.ReleaseAll()
	resp, err := h.jupyter(r.Context(), p.TeamID, in, tally)
	var ae *apierr.Error
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, resp)
	case r.Context().Err() != nil:
		// The caller is gone.
	case errors.Is(err, errBusy):
		writeBusy(w)
	case errors.As(err, &ae) && ae.Code == client.CodeBadRequest:
		writeValidation(w, &fieldError{Loc: []string{"body"}, Msg: ae.Message, Type: "value_error"})
	default:
		writeJSON(w, http.StatusOK, runJupyterResponse{Status: statusSandboxError, Message: userMessage(err), Cells: []cellRunResult{}, Files: map[string]string{}})
	}
}

// jupyterRun is a checked request.
type jupyterRun struct {
	cells       []string
	cell, total time.Duration // cell 0: none
	files       map[string][]byte
	fetch       []string
}

func checkJupyter(req runJupyterRequest) (jupyterRun, *fieldError) {
	if req.Cells == nil {
		return jupyterRun{}, invalid("cells", "field required")
	}
	if len(req.Cells) > maxCells {
		return jupyterRun{}, invalid("cells", "%d cells; at most %d", len(req.Cells), maxCells)
	}
	if req.Kernel != nil && *req.Kernel != "python3" {
		return jupyterRun{}, invalid("kernel", "unexpected value; permitted: 'python3'")
	}
	total := defaultTotalTimeout
	if req.TotalTimeout != nil {
		total = *req.TotalTimeout
	}
	if math.IsNaN(total) || total <= 0 || total > maxTimeout {
		return jupyterRun{}, invalid("total_timeout", "must be in (0, %g] seconds", maxTimeout)
	}
	cell := 0.0
	if req.CellTimeout != nil {
		cell = *req.CellTimeout
	}
	if math.IsNaN(cell) || cell < 0 || cell > maxTimeout {
		return jupyterRun{}, invalid("cell_timeout", "must be in [0, %g] seconds (0: none)", maxTimeout)
	}
	files, verr := decodeFiles(req.Files)
	if verr != nil {
		return jupyterRun{}, verr
	}
	if verr := checkFetch(req.FetchFiles); verr != nil {
		return jupyterRun{}, verr
	}
	return jupyterRun{cells: req.Cells, cell: seconds(cell), total: seconds(total), files: files, fetch: req.FetchFiles}, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// jupyter runs in in a fresh sandbox, deleted before it returns. An error
// is evalbox's failure to run it at all.
func (h *Handler) jupyter(ctx context.Context, teamID string, in jupyterRun, held outbuf.Source) (runJupyterResponse, error) {
	sbs := h.cfg.Sandboxes
	if sbs == nil || h.cfg.Dial == nil {
		return runJupyterResponse{}, apierr.Errorf(client.CodeNotImplemented, "this server does not run Jupyter cells")
	}
	sb, err := sbs.Create(ctx, teamID, client.CreateSandboxRequest{Template: jupyterTemplate, Runtime: h.cfg.Runtime,
		Timeout: int(math.Ceil(in.total.Seconds())) + 60, WaitSeconds: 600, Metadata: map[string]string{"via": "sandbox-fusion"}})
	if err != nil {
		return runJupyterResponse{}, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := sbs.Delete(dctx, teamID, sb.ID); err != nil && !isCode(err, client.CodeNotFound) {
			h.log.Warn("sandbox-fusion: delete sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	if err := trial.WriteFiles(ctx, sbs, teamID, sb.ID, jupyterCwd, in.files); err != nil {
		return runJupyterResponse{}, err
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return h.cfg.Dial(ctx, teamID, sb.ID, interpreter.Port)
		},
		DisableCompression: true,
	}}
	defer hc.CloseIdleConnections()

	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, in.total)
	defer cancel()
	status := cmdFinished
	cells := make([]cellRunResult, 0, len(in.cells))
	budget := maxRunOutput
	for _, code := range in.cells {
		cctx, ccancel := runCtx, context.CancelFunc(func() {})
		if in.cell > 0 {
			cctx, ccancel = context.WithTimeout(runCtx, in.cell)
		}
		res, err := runCell(cctx, hc, code, &budget, held)
		timedOut := cctx.Err() != nil
		ccancel()
		if err != nil && ctx.Err() == nil && timedOut {
			status = cmdTimeLimitExceeded
			break
		}
		if errors.Is(err, errKernelEnded) {
			// The code took its kernel down (os._exit, a crash): the
			// code's failure, as the service reports it.
			status = cmdError
			break
		}
		if err != nil {
			return runJupyterResponse{}, err
		}
		cells = append(cells, res)
	}
	secs := time.Since(start).Seconds()
	empty := ""
	driver := &commandRunResult{Status: status, ExecutionTime: &secs, Stdout: &empty, Stderr: &empty}
	if status != cmdFinished {
		// As the service: a run that did not finish has no cells.
		return runJupyterResponse{Status: statusFailed, Driver: driver, Cells: []cellRunResult{}, Files: map[string]string{}}, nil
	}
	zero := 0
	driver.ReturnCode = &zero
	fetched, err := trial.ReadFiles(ctx, sbs, teamID, sb.ID, jupyterCwd, in.fetch, held)
	if err != nil {
		return runJupyterResponse{}, err
	}
	if fetched.OverBudget {
		return runJupyterResponse{}, errBusy
	}
	files := map[string]string{}
	for name, b := range fetched.Files {
		files[name] = base64.StdEncoding.EncodeToString(b)
	}
	return runJupyterResponse{Status: statusSuccess, Driver: driver, Cells: cells, Files: files}, nil
}

// interpreterLine is one line of the interpreter's /execute stream, with
// raw set (internal/interpreter/server.py).
type interpreterLine struct {
	Type           string         `json:"type"`
	Text           string         `json:"text"`
	Bundle         map[string]any `json:"bundle"`
	Name           string         `json:"name"`
	Value          string         `json:"value"`
	TracebackLines []string       `json:"traceback_lines"`
}

// errBusy is a run whose output the server's memory for output cannot
// hold now: answered 503, to be asked again.
var errBusy = errors.New("the server's memory for command output is in use by other requests")

// errKernelEnded is a cell whose kernel stream ended before the cell did:
// the kernel died under it.
var errKernelEnded = errors.New("the kernel's stream ended before the cell did")

// runCell runs one cell on the default kernel and collects its lines,
// taking their size from budget (the run's bound) and reserving it from
// held (the server's memory for output).
func runCell(ctx context.Context, hc *http.Client, code string, budget *int, held outbuf.Source) (cellRunResult, error) {
	body, err := json.Marshal(map[string]any{"code": code, "raw": true})
	if err != nil {
		return cellRunResult{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://interpreter/execute", bytes.NewReader(body))
	if err != nil {
		return cellRunResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return cellRunResult{}, fmt.Errorf("the kernel: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return cellRunResult{}, fmt.Errorf("the kernel answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	res := cellRunResult{Display: []map[string]any{}, Error: []map[string]any{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxCellOutput)
	cellBytes := 0
	for sc.Scan() {
		n := len(sc.Bytes())
		cellBytes += n
		*budget -= n
		if cellBytes > maxCellOutput || *budget < 0 {
			return cellRunResult{}, fmt.Errorf("the cells' output is larger than %d bytes a cell or %d in all", maxCellOutput, maxRunOutput)
		}
		if !held.TryReserve(int64(n)) {
			return cellRunResult{}, errBusy
		}
		var l interpreterLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return cellRunResult{}, fmt.Errorf("the kernel's stream: %w", err)
		}
		switch l.Type {
		case "stdout":
			res.Stdout += l.Text
		case "stderr":
			res.Stderr += l.Text
		case "result":
			if l.Bundle != nil {
				res.Display = append(res.Display, l.Bundle)
			}
		case "error":
			tb := l.TracebackLines
			if tb == nil {
				tb = []string{}
			}
			res.Error = append(res.Error, map[string]any{"ename": l.Name, "evalue": l.Value, "traceback": tb})
		case "end_of_execution":
			return res, nil
		}
	}
	if err := sc.Err(); err != nil {
		return cellRunResult{}, fmt.Errorf("the kernel's stream: %w", err)
	}
	return cellRunResult{}, errKernelEnded
}

func isCode(err error, code string) bool {
	var ae *apierr.Error
	return errors.As(err, &ae) && ae.Code == code
}
