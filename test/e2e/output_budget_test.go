package e2e

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// The figures of TestOutputBudgetBoundsWaits: a background process prints
// outputMiB of NUL bytes to each stream (escaped 6x in JSON, as \u0000),
// and parallelWaits waits on it at once, on a server whose output budget
// is budgetMiB.
const (
	outputMiB     = 128
	parallelWaits = 32
	budgetMiB     = 300
)

// plainBinDir is the directory of an evalbox binary built without the race
// detector, for memory measurements (the race detector multiplies the
// memory of a process several times): EVALBOX_PLAIN_BIN_DIR, or the
// suite's binaries if they are plain.
func plainBinDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("EVALBOX_PLAIN_BIN_DIR")
	if dir == "" {
		dir = binDir
	}
	info, err := buildinfo.ReadFile(filepath.Join(dir, "evalbox"))
	if err != nil {
		t.Fatalf("evalbox in %s: %v", dir, err)
	}
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			t.Fatalf("%s/evalbox is built with -race, whose memory use this test cannot bound: set EVALBOX_PLAIN_BIN_DIR to a plain build (scripts/test.sh does)", dir)
		}
	}
	return dir
}

// createOn creates a sandbox on server s and registers its deletion and the
// leak check at cleanup.
func createOn(t *testing.T, s *server, req client.CreateSandboxRequest) *client.Sandbox {
	t.Helper()
	sb, err := s.admin.CreateSandbox(ctxT(t, 2*time.Minute), req)
	if err != nil {
		t.Fatalf("create sandbox %+v: %v", req, err)
	}
	t.Cleanup(func() {
		if err := s.admin.DeleteSandbox(context.Background(), sb.ID); err != nil && !client.IsNotFound(err) {
			t.Errorf("delete %s: %v", sb.ID, err)
		}
		assertGone(t, s, sb.ID)
	})
	return sb
}

// memStatus reads VmRSS and VmHWM (bytes) of process pid.
func memStatus(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("server status: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// rawWait waits on a process through plain HTTP and reads the answer without
// keeping it: its status, its length, its first and last bytes and its
// Retry-After header.
type waitAnswer struct {
	status      int
	length      int64
	head, tail  []byte
	retryAfter  string
	contentType string
}

func rawWait(ctx context.Context, s *server, sandboxID, pid string) (waitAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/sandboxes/"+sandboxID+"/processes/"+pid+"/wait", nil)
	if err != nil {
		return waitAnswer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+s.adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return waitAnswer{}, err
	}
	defer resp.Body.Close()
	a := waitAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), contentType: resp.Header.Get("Content-Type")}
	buf := make([]byte, 256<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if len(a.head) < 64 {
				a.head = append(a.head, buf[:min(n, 64-len(a.head))]...)
			}
			a.tail = append(a.tail, buf[:n]...)
			if len(a.tail) > 1024 {
				a.tail = append(a.tail[:0:0], a.tail[len(a.tail)-512:]...)
			}
			a.length += int64(n)
		}
		if err == io.EOF {
			return a, nil
		}
		if err != nil {
			return a, err
		}
	}
}

// TestOutputBudgetBoundsWaits: parallel buffered waits on a process with a
// large output no longer pin the server's memory. Every wait ends with 200
// and the whole output, or 429 output_budget_exhausted with Retry-After;
// the server's peak RSS stays within a few times its output budget; it
// still answers; and a wait afterwards gets the whole output.
func TestOutputBudgetBoundsWaits(t *testing.T) {
	s, err := startServer(serverOptions{binDir: plainBinDir(t),
		args: []string{"--runtimes", "namespaces", "--output-memory-mb", strconv.Itoa(budgetMiB)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// After the sandboxes' cleanups (registered later, run first).
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := ctxT(t, 10*time.Minute)
	sb := createOn(t, s, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 2048})
	const n = outputMiB << 20
	p, err := s.admin.StartProcess(ctx, sb.ID, client.ExecRequest{
		Cmd:            fmt.Sprintf("head -c %d /dev/zero; head -c %d /dev/zero >&2", n, n),
		MaxOutputBytes: n,
	})
	if err != nil {
		t.Fatal(err)
	}
	for {
		pr, err := s.admin.GetProcess(ctx, sb.ID, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !pr.Running {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	pid := s.cmd.Process.Pid
	rssBefore, _ := memStatus(t, pid)
	var peakRSS atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if rss, _ := memStatus(t, pid); rss > peakRSS.Load() {
				peakRSS.Store(rss)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	// A whole answer: both streams of n NULs, each escaped to 6n bytes.
	wholeLen := int64(2*6*n) + int64(len(`{"stdout":"","stderr":""}`))
	check := func(a waitAnswer) error {
		switch a.status {
		case http.StatusOK:
			if a.length < wholeLen || !bytes.HasPrefix(a.head, []byte(`{"stdout":"\u0000\u0000`)) ||
				!bytes.Contains(a.tail, []byte(`"exit_code":0`)) || !bytes.Contains(a.tail, []byte(`"stdout_truncated":false,"stderr_truncated":false`)) {
				return fmt.Errorf("200 with %d bytes (want >= %d), head %q, tail %q", a.length, wholeLen, a.head, a.tail)
			}
		case http.StatusTooManyRequests:
			if a.retryAfter == "" || !bytes.Contains(a.head, []byte(`{"error":{"code":"output_budget_exhausted"`)) {
				return fmt.Errorf("429 without Retry-After or the code: %q %q", a.retryAfter, a.head)
			}
		default:
			return fmt.Errorf("status %d: %q", a.status, a.head)
		}
		return nil
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for range parallelWaits {
		wg.Go(func() {
			a, err := rawWait(ctx, s, sb.ID, p.ID)
			if err == nil {
				err = check(a)
			}
			mu.Lock()
			defer mu.Unlock()
			statuses[a.status]++
			if err != nil {
				t.Errorf("wait: %v", err)
			}
		})
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	_, hwm := memStatus(t, pid)
	t.Logf("%d parallel waits on %d MiB per stream, budget %d MiB: statuses %v; server RSS before %d MiB, peak sampled %d MiB, VmHWM %d MiB",
		parallelWaits, outputMiB, budgetMiB, statuses, rssBefore>>20, peakRSS.Load()>>20, hwm>>20)
	if statuses[http.StatusTooManyRequests] == 0 {
		t.Errorf("no wait was refused: %v", statuses)
	}
	if limit := rssBefore + 3*budgetMiB<<20; hwm > limit {
		t.Errorf("server peak RSS %d MiB, above %d MiB (RSS before + 3x the budget)", hwm>>20, limit>>20)
	}
	if _, err := s.admin.Health(ctx); err != nil {
		t.Fatalf("server no longer answers: %v", err)
	}
	// With the budget free again, a wait gets the whole output.
	a, err := rawWait(ctx, s, sb.ID, p.ID)
	if err == nil && a.status != http.StatusOK {
		err = fmt.Errorf("status %d: %q", a.status, a.head)
	}
	if err == nil {
		err = check(a)
	}
	if err != nil {
		t.Errorf("wait with the budget free: %v", err)
	}
}

// TestOutputBudgetSmall: on a server with a 16 MiB output budget, a wait
// that cannot be held answers 429 and leaves the process running, the
// process's stream (no budget) still gets all of its output; an exec whose
// output outgrows the budget runs to its end and answers 200 with its
// output cut and said so, while a streamed exec gets all of it; and
// /v1/execute cuts the same way.
func TestOutputBudgetSmall(t *testing.T) {
	s, err := startServer(serverOptions{args: []string{"--runtimes", "namespaces", "--output-memory-mb", "16"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// After the sandboxes' cleanups (registered later, run first).
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := ctxT(t, 5*time.Minute)
	sb := createOn(t, s, client.CreateSandboxRequest{Template: "base", Runtime: client.RuntimeNamespaces, MemoryMB: 512})
	const n = 32 << 20
	p, err := s.admin.StartProcess(ctx, sb.ID, client.ExecRequest{
		Cmd: fmt.Sprintf("head -c %d /dev/zero; echo done >&2; exec sleep 600", n), MaxOutputBytes: n,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.admin.WaitProcess(ctx, sb.ID, p.ID, 60*time.Second)
	if !client.IsOutputBudgetExhausted(err) {
		t.Fatalf("wait on %d bytes with a 16 MiB budget: %v", n, err)
	}
	if ae := (*client.APIError)(nil); !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.RetryAfter <= 0 {
		t.Errorf("refused wait: %#v", err)
	}
	pr, err := s.admin.GetProcess(ctx, sb.ID, p.ID)
	if err != nil || !pr.Running {
		t.Fatalf("process after the refused wait: %+v %v", pr, err)
	}
	// The stream uses no budget; it ends when the process is killed.
	var got countWriter
	streamed := make(chan error, 1)
	go func() {
		_, err := s.admin.StreamProcess(ctx, sb.ID, p.ID, &got, io.Discard)
		streamed <- err
	}()
	for got.n.Load() < n {
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-streamed:
			t.Fatalf("stream ended early (%d bytes): %v", got.n.Load(), err)
		default:
		}
	}
	if err := s.admin.KillProcess(ctx, sb.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-streamed; err != nil || got.n.Load() != n {
		t.Errorf("stream: %d bytes, %v", got.n.Load(), err)
	}

	// A buffered exec whose output outgrows the budget runs to its end.
	res, err := s.admin.Exec(ctx, sb.ID, client.ExecRequest{
		Cmd: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo end >&2; exit 3", n), MaxOutputBytes: n,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || !res.StdoutTruncated || res.StderrTruncated || res.Stderr != "end\n" ||
		len(res.Stdout) >= n || len(res.Stdout) < 1<<20 || strings.Trim(res.Stdout, "x") != "" ||
		!strings.Contains(res.Error, "server's memory for buffered output") {
		t.Errorf("exec past the budget: exit %d, %d bytes of stdout, truncated %v/%v, stderr %q, error %q",
			res.ExitCode, len(res.Stdout), res.StdoutTruncated, res.StderrTruncated, res.Stderr, res.Error)
	}
	// Streamed, the same command gets all of its output.
	var streamedOut countWriter
	res, err = s.admin.ExecStream(ctx, sb.ID, client.ExecRequest{
		Cmd: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", n), MaxOutputBytes: n,
	}, &streamedOut, io.Discard)
	if err != nil || res.ExitCode != 0 || res.StdoutTruncated || streamedOut.n.Load() != n {
		t.Errorf("streamed exec: %+v %v, %d bytes", res, err, streamedOut.n.Load())
	}

	// POST /v1/execute cuts the same way.
	er, err := s.admin.Execute(ctx, client.ExecuteRequest{Language: client.LanguageBash, Runtime: client.RuntimeNamespaces,
		Scripts: []string{fmt.Sprintf("head -c %d /dev/zero | tr '\\0' y", n), "echo small"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := er.Results[0]; !r.StdoutTruncated || len(r.Stdout) >= n || !strings.Contains(r.Error, "server's memory for buffered output") {
		t.Errorf("execute past the budget: %d bytes, truncated %v, error %q", len(r.Stdout), r.StdoutTruncated, r.Error)
	}
	if r := er.Results[1]; r.Stdout != "small\n" || r.StdoutTruncated || r.Error != "" {
		t.Errorf("execute's small script: %+v", r)
	}
	if _, err := s.admin.Health(ctx); err != nil {
		t.Fatal(err)
	}
}

type countWriter struct{ n atomic.Int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}
