package e2e

// The node agent (`evalbox node`) as a process, against a real
// kube-apiserver (internal/kubetest): its Lease, the contract over gRPC
// with the node token, readiness, shutdown, a restart after kill -9, and
// templates fetched from a control plane (`evalbox serve
// --node-token-file`).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/evalbox/evalbox/internal/fleet/membership"
	"github.com/evalbox/evalbox/internal/kubetest"
	"github.com/evalbox/evalbox/internal/leaks"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/nodeapi/grpcnode"
)

const nodeNamespace = "evalbox"

// cluster is a kube-apiserver for node tests.
type cluster struct {
	env *kubetest.Env
	cs  kubernetes.Interface
}

func startCluster(t *testing.T, withNamespace bool) *cluster {
	t.Helper()
	env := kubetest.Start(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{env: env, cs: cs}
	if withNamespace {
		c.createNamespace(t)
	}
	return c
}

func (c *cluster) createNamespace(t *testing.T) {
	t.Helper()
	_, err := c.cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nodeNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// lease returns the node's Lease as the control plane reads it, or nil.
func (c *cluster) lease(t *testing.T, id string) *membership.Node {
	t.Helper()
	l, err := c.cs.CoordinationV1().Leases(nodeNamespace).Get(context.Background(), id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var capacity membership.Capacity
	if err := json.Unmarshal([]byte(l.Annotations[membership.AnnotationCapacity]), &capacity); err != nil {
		t.Fatalf("capacity annotation: %v", err)
	}
	n := &membership.Node{ID: l.Name, Address: l.Annotations[membership.AnnotationAddress], Capacity: capacity}
	if l.Spec.AcquireTime != nil {
		n.AcquireTime = l.Spec.AcquireTime.Time
	}
	return n
}

// waitLease waits until the node's Lease satisfies ok.
func (c *cluster) waitLease(t *testing.T, id string, d time.Duration, what string, ok func(*membership.Node) bool) *membership.Node {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		n := c.lease(t, id)
		if ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lease %s: %s not within %v (now %+v)", id, what, d, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type nodeOptions struct {
	id           string
	dataDir      string // "" = a new temp dir, removed at the end
	templatesDir string // "" = the shared built-ins
	controlPlane string
	args         []string
}

// nodeProc is a running `evalbox node`.
type nodeProc struct {
	t         *testing.T
	id        string
	cmd       *exec.Cmd
	dataDir   string
	addr      string
	health    string
	token     string
	logPath   string
	exited    chan struct{}
	exitErr   error
	startedAt time.Time
}

// nodeToken is the node token of every test node and control plane.
const nodeToken = "e2e-node-token-0123456789abcdef"

func writeToken(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "node.token")
	if err := os.WriteFile(p, []byte(nodeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startNode starts a node agent; it is stopped (SIGTERM) at the end of t
// if it still runs.
func startNode(t *testing.T, c *cluster, o nodeOptions) *nodeProc {
	t.Helper()
	n := &nodeProc{t: t, id: o.id, dataDir: o.dataDir, token: nodeToken, exited: make(chan struct{})}
	if n.dataDir == "" {
		d, err := os.MkdirTemp("", "evalbox-e2e-node-")
		if err != nil {
			t.Fatal(err)
		}
		n.dataDir = d
		t.Cleanup(func() { _ = os.RemoveAll(d) })
	}
	tdir := o.templatesDir
	if tdir == "" {
		tdir = templatesDir
	}
	var err error
	if n.addr, err = freePort(); err != nil {
		t.Fatal(err)
	}
	if n.health, err = freePort(); err != nil {
		t.Fatal(err)
	}
	n.logPath = filepath.Join(n.dataDir, "node.log")
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := []string{"node", "--data-dir", n.dataDir, "--templates-dir", tdir, "--listen", n.addr, "--health-listen", n.health,
		"--node-id", o.id, "--token-file", writeToken(t), "--kubeconfig", c.env.Kubeconfig, "--namespace", nodeNamespace,
		"--lease-duration", "3", "--log-level", "debug"}
	if o.controlPlane != "" {
		args = append(args, "--control-plane", o.controlPlane)
	}
	n.cmd = exec.Command(filepath.Join(binDir, "evalbox"), append(args, o.args...)...)
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	n.startedAt = time.Now()
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.exitErr = n.cmd.Wait(); close(n.exited) }()
	t.Cleanup(func() {
		if n.running() {
			_ = n.stop()
		}
	})
	return n
}

func (n *nodeProc) running() bool {
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// readyz returns /readyz's status code, or 0 when it cannot be reached.
func (n *nodeProc) readyz() int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + n.health + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitReady waits for /readyz to answer 200 and returns how long the node
// took from its start.
func (n *nodeProc) waitReady(d time.Duration) time.Duration {
	n.t.Helper()
	deadline := time.Now().Add(d)
	for {
		if n.readyz() == http.StatusOK {
			return time.Since(n.startedAt)
		}
		if !n.running() {
			n.t.Fatalf("node %s exited: %v\n%s", n.id, n.exitErr, tail(n.logPath, 30))
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("node %s not ready within %v\n%s", n.id, d, tail(n.logPath, 30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the exit.
func (n *nodeProc) stop() error {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
		return n.exitErr
	case <-time.After(90 * time.Second):
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.exited
		return errors.New("node did not stop within 90 s")
	}
}

// crash kills the node process alone (kill -9): its sandboxes stay.
func (n *nodeProc) crash() {
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
}

func (n *nodeProc) client(t *testing.T, token string) *grpcnode.Client {
	t.Helper()
	cc, err := grpcnode.Dial(n.addr, grpcnode.ClientConfig{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return grpcnode.NewClient(cc)
}

// builtinDigest is the digest of a built-in in the shared templates dir.
func builtinDigest(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(templatesDir, name, "template.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj struct{ Digest string }
	if err := json.Unmarshal(b, &tj); err != nil || tj.Digest == "" {
		t.Fatalf("%s/template.json: %v", name, err)
	}
	return tj.Digest
}

func pythonSpec(t *testing.T, runtime string) nodeapi.Spec {
	return nodeapi.Spec{Template: builtinDigest(t, "python"), Runtime: runtime,
		Shape: nodeapi.Shape{CPU: 1, MemoryMB: 512, DiskMB: 1024, Pids: 1024, Network: nodeapi.NetworkNone}}
}

func execPython(t *testing.T, c nodeapi.Node, id string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	x, err := c.Exec(ctxT(t, time.Minute), id, nodeapi.ExecRequest{Argv: []string{"python3", "-c", "print(6*7)"}}, nil, &stdout, &stderr)
	if err != nil || x.ExitCode != 0 || stdout.String() != "42\n" {
		t.Fatalf("exec: %+v, %v, stdout %q stderr %q", x, err, stdout.String(), stderr.String())
	}
}

func assertNoLeftovers(t *testing.T, dataDir string, ids ...string) {
	t.Helper()
	if left := leaks.WaitGone(context.Background(), dataDir, ids, 10*time.Second); len(left) > 0 {
		t.Errorf("left on the host:\n  %s", strings.Join(left, "\n  "))
	}
}

// TestNodeAgent: readiness waits for the Lease; the Lease carries the
// node's address and capacity, which follows its sandboxes; a control
// plane with the token creates, execs and destroys; a wrong token is
// refused; SIGTERM leaves no sandbox and no Lease.
func TestNodeAgent(t *testing.T) {
	c := startCluster(t, false)
	n := startNode(t, c, nodeOptions{id: "node-a"})
	// No namespace yet: the Lease cannot be written, so the node serves
	// but is not ready.
	deadline := time.Now().Add(2 * time.Minute)
	for n.readyz() != http.StatusServiceUnavailable {
		if time.Now().After(deadline) || !n.running() {
			t.Fatalf("/readyz never answered 503 before the Lease was written\n%s", tail(n.logPath, 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get("http://" + n.health + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	c.createNamespace(t)
	n.waitReady(time.Minute)

	l := c.lease(t, "node-a")
	if l == nil {
		t.Fatal("ready without a Lease")
	}
	py := builtinDigest(t, "python")
	capa := l.Capacity
	if l.Address != n.addr || capa.CPUs != goruntime.NumCPU() || capa.MemoryMB <= 0 || capa.Pids <= 0 ||
		capa.Free.MemoryMB != capa.MemoryMB || capa.Free.Pids != capa.Pids || capa.Sandboxes != 0 ||
		!slices.Equal(capa.Runtimes, []string{"gvisor", "namespaces"}) || !slices.Contains(capa.Templates, py) {
		t.Fatalf("Lease: %+v", l)
	}

	// A wrong token is refused before anything runs.
	if _, err := n.client(t, "wrong-token").Runtimes(ctxT(t, 10*time.Second)); err == nil || !strings.Contains(err.Error(), "the node refused the call") {
		t.Errorf("wrong token: %v", err)
	}

	node := n.client(t, n.token)
	var ids []string
	for _, rt := range []string{"namespaces", "gvisor"} {
		info, err := node.Create(ctxT(t, 2*time.Minute), nodeapi.CreateRequest{Spec: pythonSpec(t, rt)})
		if err != nil {
			t.Fatalf("create %s: %v", rt, err)
		}
		ids = append(ids, info.ID)
		execPython(t, node, info.ID)
	}
	during := c.waitLease(t, "node-a", 10*time.Second, "2 sandboxes", func(l *membership.Node) bool { return l != nil && l.Capacity.Sandboxes == 2 })
	if during.Capacity.Free.Pids >= capa.Pids || during.Capacity.Free.MemoryMB >= capa.MemoryMB {
		t.Errorf("free capacity did not go down: %+v", during.Capacity)
	}
	if err := node.Destroy(ctxT(t, time.Minute), ids[0]); err != nil {
		t.Fatal(err)
	}
	c.waitLease(t, "node-a", 10*time.Second, "1 sandbox", func(l *membership.Node) bool { return l != nil && l.Capacity.Sandboxes == 1 })
	assertNoLeftovers(t, n.dataDir, ids[0])

	// SIGTERM with a sandbox running: not ready, then gone, sandbox and
	// Lease with it, exit 0.
	// not ready while it shuts down (its gVisor sandbox takes a while to
	// destroy): /readyz answers 503 until the process is gone.
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	saw503 := false
	for stopBy := time.Now().Add(90 * time.Second); n.running(); {
		if time.Now().After(stopBy) {
			t.Fatal("node did not stop")
		}
		code := n.readyz()
		if code == http.StatusServiceUnavailable {
			saw503 = true
		} else if code == http.StatusOK && saw503 {
			t.Fatal("/readyz answered 200 again during the shutdown")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !saw503 {
		t.Error("/readyz never answered 503 during the shutdown")
	}
	if n.exitErr != nil {
		t.Fatalf("exit: %v\n%s", n.exitErr, tail(n.logPath, 20))
	}
	if l := c.lease(t, "node-a"); l != nil {
		t.Errorf("Lease left after SIGTERM: %+v", l)
	}
	assertNoLeftovers(t, n.dataDir, ids...)
	if log, _ := os.ReadFile(n.logPath); bytes.Contains(log, []byte(nodeToken)) {
		t.Error("the node logged its token")
	}
}

// TestNodeRestartSweeps: a node restart sweeps what it left (kill -9 with
// sandboxes running, then a start on the same data dir).
func TestNodeRestartSweeps(t *testing.T) {
	c := startCluster(t, true)
	n := startNode(t, c, nodeOptions{id: "node-r"})
	t.Logf("node start to ready (swept, serving, Lease written): %v", n.waitReady(2*time.Minute).Round(time.Millisecond))
	first := c.lease(t, "node-r")
	node := n.client(t, n.token)
	var ids []string
	for _, rt := range []string{"namespaces", "gvisor"} {
		info, err := node.Create(ctxT(t, 2*time.Minute), nodeapi.CreateRequest{Spec: pythonSpec(t, rt)})
		if err != nil {
			t.Fatalf("create %s: %v", rt, err)
		}
		ids = append(ids, info.ID)
	}
	n.crash()
	for _, id := range ids {
		if len(leaks.ByID(n.dataDir, id)) == 0 {
			t.Fatalf("kill -9 left nothing of %s: the test would prove nothing", id)
		}
	}
	n2 := startNode(t, c, nodeOptions{id: "node-r", dataDir: n.dataDir})
	t.Logf("node restart to ready, sweeping 2 sandboxes left by kill -9: %v", n2.waitReady(2*time.Minute).Round(time.Millisecond))
	assertNoLeftovers(t, n.dataDir, ids...)
	again := c.lease(t, "node-r")
	if again == nil || !again.AcquireTime.After(first.AcquireTime) || again.Capacity.Sandboxes != 0 || again.Address != n2.addr {
		t.Errorf("Lease after the restart: %+v (before %+v)", again, first)
	}
	if _, err := n2.client(t, n2.token).Stat(ctxT(t, 10*time.Second), ids[0], "/"); !errors.Is(err, nodeapi.ErrSandboxNotFound) {
		t.Errorf("a sandbox of the previous run: %v", err)
	}
	if err := n2.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestNodeIDTakenOver: a second process with the same node id takes the
// Lease; the first stops with a clear error and a non-zero exit.
func TestNodeIDTakenOver(t *testing.T) {
	c := startCluster(t, true)
	a := startNode(t, c, nodeOptions{id: "node-dup", args: []string{"--runtimes", "namespaces"}})
	a.waitReady(2 * time.Minute)
	b := startNode(t, c, nodeOptions{id: "node-dup", args: []string{"--runtimes", "namespaces"}})
	b.waitReady(2 * time.Minute)
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the first node kept running with its Lease taken over")
	}
	var ee *exec.ExitError
	if !errors.As(a.exitErr, &ee) || ee.ExitCode() != 1 {
		t.Errorf("first node's exit: %v", a.exitErr)
	}
	if log := tail(a.logPath, 5); !strings.Contains(log, `another process took the Lease of node "node-dup"`) {
		t.Errorf("first node's last words:\n%s", log)
	}
	if l := c.lease(t, "node-dup"); l == nil || l.Address != b.addr {
		t.Errorf("Lease after the takeover: %+v", l)
	}
}

// contentDigest asks the control plane for a template's content digest
// (the header of its export stream), as the control plane's own code does
// with template.Registry.ContentDigest.
func contentDigest(t *testing.T, s *server, digest string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.url+nodeapi.TemplatePath(digest), nil)
	req.Header.Set("Authorization", "Bearer "+nodeToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	cd := resp.Header.Get(nodeapi.HeaderContentDigest)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(cd, "sha256:") {
		t.Fatalf("GET %s: %s, content digest %q", req.URL.Path, resp.Status, cd)
	}
	return cd
}

// TestTemplatesReachANodeThatLacksThem: a node with an empty templates dir
// creates sandboxes of templates the control plane has; concurrent creates
// fetch once; a wrong content digest or token leaves nothing.
func TestTemplatesReachANodeThatLacksThem(t *testing.T) {
	c := startCluster(t, true)
	cp, err := startServer(serverOptions{args: []string{"--node-token-file", writeToken(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.stop() })
	py, base := builtinDigest(t, "python"), builtinDigest(t, "base")

	// The endpoint wants the node token.
	for _, tok := range []string{"", "Bearer wrong"} {
		req, _ := http.NewRequest(http.MethodGet, cp.url+nodeapi.TemplatePath(py), nil)
		if tok != "" {
			req.Header.Set("Authorization", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %s", tok, resp.Status)
		}
	}
	pyCD, baseCD := contentDigest(t, cp, py), contentDigest(t, cp, base)

	n := startNode(t, c, nodeOptions{id: "node-empty", templatesDir: t.TempDir(), controlPlane: cp.url, args: []string{"--runtimes", "namespaces"}})
	n.waitReady(2 * time.Minute)
	if l := c.lease(t, "node-empty"); l == nil || len(l.Capacity.Templates) != 0 {
		t.Fatalf("an empty node's Lease: %+v", l)
	}
	node := n.client(t, n.token)
	spec := pythonSpec(t, "namespaces")

	// Without a content digest, or with a wrong one: template_missing,
	// nothing kept.
	for _, cd := range []string{"", baseCD} {
		_, err := node.Create(ctxT(t, time.Minute), nodeapi.CreateRequest{Spec: spec, ContentDigest: cd})
		if !errors.Is(err, nodeapi.ErrTemplateMissing) {
			t.Fatalf("content digest %q: %v", cd, err)
		}
	}
	for _, d := range []string{"templates", "tmp"} {
		if entries, _ := os.ReadDir(filepath.Join(n.dataDir, "images", d)); len(entries) > 0 {
			t.Errorf("images/%s holds %d entries after refused fetches", d, len(entries))
		}
	}

	// Three creates at once of a template the node lacks: one fetch.
	var wg sync.WaitGroup
	infos := make([]nodeapi.SandboxInfo, 3)
	errs := make([]error, 3)
	for i := range infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = node.Create(ctxT(t, 5*time.Minute), nodeapi.CreateRequest{Spec: spec, ContentDigest: pyCD})
		}()
	}
	wg.Wait()
	var ids []string
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v\n%s", i, err, tail(n.logPath, 20))
		}
		ids = append(ids, infos[i].ID)
		execPython(t, node, infos[i].ID)
	}
	log, _ := os.ReadFile(n.logPath)
	if got := bytes.Count(log, []byte(`msg="template fetched"`)); got != 1 {
		t.Errorf("%d fetches of one template, want 1", got)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `msg="template fetched"`) {
			t.Logf("python over loopback: %s", line[strings.Index(line, "bytes="):])
		}
	}
	c.waitLease(t, "node-empty", 10*time.Second, "the fetched template", func(l *membership.Node) bool {
		return l != nil && slices.Contains(l.Capacity.Templates, py)
	})
	for _, id := range ids {
		if err := node.Destroy(ctxT(t, time.Minute), id); err != nil {
			t.Fatal(err)
		}
	}
	assertNoLeftovers(t, n.dataDir, ids...)
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestNodeBadFlags: a bad command line is one readable line and exit 2,
// before anything starts.
func TestNodeBadFlags(t *testing.T) {
	for _, a := range [][]string{
		{"node"},
		{"node", "--token-file", "/nonexistent"},
		{"node", "--token-file", writeToken(t), "--node-id", "Not_Valid"},
		{"node", "--token-file", writeToken(t), "--lease-duration", "500ms"},
	} {
		cmd := exec.Command(filepath.Join(binDir, "evalbox"), a...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: %v, stderr %q", a, err, stderr.String())
		}
	}
}
