package sandboxfusion

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/pkg/client"
)

// fakeSandboxes is one sandbox's files, its creates and deletes.
type fakeSandboxes struct {
	mu               sync.Mutex
	created, deleted []string
	req              client.CreateSandboxRequest
	files            map[string]string
}

func (f *fakeSandboxes) Create(_ context.Context, _ string, req client.CreateSandboxRequest) (client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.req = req
	f.created = append(f.created, "sb-1")
	return client.Sandbox{ID: "sb-1"}, nil
}

func (f *fakeSandboxes) Delete(_ context.Context, _, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, id)
	return nil
}

func (f *fakeSandboxes) WriteFile(_ context.Context, _, _, path, _ string, r io.Reader) (client.FileInfo, error) {
	b, err := io.ReadAll(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.files == nil {
		f.files = map[string]string{}
	}
	f.files[path] = string(b)
	return client.FileInfo{}, err
}

func (f *fakeSandboxes) OpenFile(_ context.Context, _, _, path string) (client.FileInfo, io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[path]
	if !ok {
		return client.FileInfo{}, nil, &apierr.Error{Code: client.CodeNotFound, Message: "no " + path}
	}
	return client.FileInfo{Type: client.FileTypeFile, Size: int64(len(b))}, io.NopCloser(strings.NewReader(b)), nil
}

// fakeInterpreter answers /execute as internal/interpreter's server does
// with raw set: a cell "sleep" never ends; "boom" raises; "die" ends the
// stream before the cell (its kernel died).
func fakeInterpreter(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Code string `json:"code"`
			Raw  bool   `json:"raw"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !body.Raw || r.URL.Path != "/execute" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		emit := func(v map[string]any) { _ = enc.Encode(v); w.(http.Flusher).Flush() }
		emit(map[string]any{"type": "number_of_executions", "execution_count": 1})
		switch body.Code {
		case "sleep":
			emit(map[string]any{"type": "stdout", "text": "zz"})
			<-r.Context().Done()
			return
		case "die":
			// The kernel died under the cell: the stream ends early.
			emit(map[string]any{"type": "stdout", "text": "bye"})
			return
		case "boom":
			emit(map[string]any{"type": "error", "name": "RuntimeError", "value": "boom", "traceback": "a\nb", "traceback_lines": []string{"a", "b"}})
		default:
			emit(map[string]any{"type": "stdout", "text": "out1 "})
			emit(map[string]any{"type": "keepalive"})
			emit(map[string]any{"type": "stdout", "text": "out2"})
			emit(map[string]any{"type": "stderr", "text": "err"})
			emit(map[string]any{"type": "result", "text": "abc", "bundle": map[string]any{"text/plain": "'abc'"}})
		}
		emit(map[string]any{"type": "end_of_execution"})
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func serveJupyter(t *testing.T, sbs *fakeSandboxes, addr, body string) (int, map[string]any) {
	t.Helper()
	var d net.Dialer
	cfg := Config{Auth: keys{}, Sandboxes: sbs, Dial: func(ctx context.Context, teamID, id string, port int) (net.Conn, error) {
		if teamID != "team-a" || id != "sb-1" || port != 49999 {
			t.Errorf("dial %s %s %d", teamID, id, port)
		}
		return d.DialContext(ctx, "tcp", addr)
	}}
	mux := http.NewServeMux()
	New(cfg).Register(mux)
	req := httptest.NewRequest(http.MethodPost, "/run_jupyter", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer good")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	return rec.Code, m
}

// TestRunJupyter: each cell's streams, displays (the MIME bundle as the
// kernel gave it) and errors; the files in and out; the sandbox deleted.
func TestRunJupyter(t *testing.T) {
	sbs := &fakeSandboxes{}
	addr := fakeInterpreter(t)
	code, m := serveJupyter(t, sbs, addr, `{"cells": ["x", "boom"], "files": {"in.txt": "aGk="}, "fetch_files": ["in.txt", "nope"], "total_timeout": 20}`)
	if code != 200 || m["status"] != "Success" {
		t.Fatalf("%d %v", code, m)
	}
	cells := m["cells"].([]any)
	c0, c1 := cells[0].(map[string]any), cells[1].(map[string]any)
	if c0["stdout"] != "out1 out2" || c0["stderr"] != "err" || len(c0["display"].([]any)) != 1 ||
		c0["display"].([]any)[0].(map[string]any)["text/plain"] != "'abc'" || len(c0["error"].([]any)) != 0 {
		t.Errorf("cell 0 %v", c0)
	}
	e := c1["error"].([]any)[0].(map[string]any)
	if e["ename"] != "RuntimeError" || e["evalue"] != "boom" || len(e["traceback"].([]any)) != 2 {
		t.Errorf("cell 1 %v", c1)
	}
	if d := m["driver"].(map[string]any); d["status"] != "Finished" || d["return_code"] != 0.0 {
		t.Errorf("driver %v", d)
	}
	if f := m["files"].(map[string]any); len(f) != 1 || f["in.txt"] != "aGk=" {
		t.Errorf("files %v", f)
	}
	if sbs.req.Template != "code-interpreter" || sbs.files["/home/user/in.txt"] != "hi" || len(sbs.deleted) != 1 {
		t.Errorf("create %+v, files %v, deleted %v", sbs.req, sbs.files, sbs.deleted)
	}
}

// TestRunJupyterTimeout: a cell past cell_timeout (or the total) fails the
// run, without cells, as the service answers; the sandbox goes.
func TestRunJupyterTimeout(t *testing.T) {
	addr := fakeInterpreter(t)
	for _, body := range []string{`{"cells": ["x", "sleep", "x"], "cell_timeout": 0.3}`, `{"cells": ["sleep"], "total_timeout": 0.3}`} {
		sbs := &fakeSandboxes{}
		start := time.Now()
		code, m := serveJupyter(t, sbs, addr, body)
		if code != 200 || m["status"] != "Failed" || len(m["cells"].([]any)) != 0 || m["driver"].(map[string]any)["status"] != "TimeLimitExceeded" {
			t.Errorf("%s: %d %v", body, code, m)
		}
		if time.Since(start) > 10*time.Second || len(sbs.deleted) != 1 {
			t.Errorf("%s: took %s, deleted %v", body, time.Since(start), sbs.deleted)
		}
	}
}

// TestRunJupyterKernelDies: code that takes its kernel down is the code's
// failure (Failed, the driver's status Error), not evalbox's.
func TestRunJupyterKernelDies(t *testing.T) {
	sbs := &fakeSandboxes{}
	code, m := serveJupyter(t, sbs, fakeInterpreter(t), `{"cells": ["x", "die", "x"]}`)
	if code != 200 || m["status"] != "Failed" || m["driver"].(map[string]any)["status"] != "Error" || len(m["cells"].([]any)) != 0 {
		t.Errorf("%d %v", code, m)
	}
	if len(sbs.deleted) != 1 {
		t.Errorf("deleted %v", sbs.deleted)
	}
}

// TestRunJupyterBadInput: 422s, and no sandbox.
func TestRunJupyterBadInput(t *testing.T) {
	for _, body := range []string{`{}`, `{"cells": ["x"], "kernel": "ruby"}`, `{"cells": ["x"], "total_timeout": 0}`,
		`{"cells": ["x"], "cell_timeout": -1}`, `{"cells": ["x"], "files": {"a": "!"}}`, `{"cells": ["x"], "fetch_files": [""]}`} {
		sbs := &fakeSandboxes{}
		code, _ := serveJupyter(t, sbs, "127.0.0.1:1", body)
		if code != http.StatusUnprocessableEntity || len(sbs.created) != 0 {
			t.Errorf("%s: %d, created %v", body, code, sbs.created)
		}
	}
}
