// Package kubetest runs a real Kubernetes API server for tests: etcd and
// kube-apiserver as child processes on loopback, the way controller-runtime's
// envtest does, with no kubelet, scheduler or controller manager. Objects are
// stored and validated, watches and RBAC work, and nothing runs them: enough
// for membership (Leases), RBAC and manifest dry-runs, which is what evalbox
// needs of Kubernetes.
//
// The binaries come from $EVALBOX_KUBE_BIN_DIR, which scripts/kube.sh builds
// from pinned Go module versions and scripts/test.sh exports. As with the
// repo's other test prerequisites (EVALBOX_TEST_ROOTFS, EVALBOX_BIN_DIR), a
// test skips, saying how to get them, when the variable is unset; one that
// is set but names a directory without them fails.
//
// Every Env has its own ports, data directory, certificates and tokens: tests
// in several packages may each start one at once.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// BinDirEnv names the environment variable that holds the directory of the
// kube-apiserver and etcd binaries.
const BinDirEnv = "EVALBOX_KUBE_BIN_DIR"

// AdminUser is the user of Env.Config: a member of system:masters, which the
// API server lets do anything, RBAC or not.
const AdminUser = "kubetest-admin"

// startTimeout bounds how long a server may take to become ready. An
// apiserver is ready in seconds on an idle machine; this one may share two
// cores with compilers.
const startTimeout = 3 * time.Minute

// Env is one etcd and one kube-apiserver serving it, for one test.
type Env struct {
	// Config is the admin's (AdminUser, by a static bearer token). A test
	// of least privilege makes another user's from it with
	// rest.AnonymousClientConfig and that user's token.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file for the same admin and server, for
	// processes the test starts.
	Kubeconfig string

	binDir, dir string
	pki         *pki
	token       string
	etcdPort    int // client port
	peerPort    int
	apiPort     int

	mu        sync.Mutex
	etcd, api *proc
}

// Start starts etcd and kube-apiserver, waits until the apiserver is ready
// (/readyz: storage reachable, bootstrap RBAC roles written), and stops both
// and removes their files when the test ends. It skips the test when
// $EVALBOX_KUBE_BIN_DIR is unset.
func Start(t testing.TB) *Env {
	t.Helper()
	bin := binDir(t)
	e := &Env{binDir: bin, dir: t.TempDir()} // removed after the Cleanup below stopped the servers
	t.Cleanup(func() { e.cleanup(t) })

	var err error
	if e.pki, err = makePKI(e.dir); err != nil {
		t.Fatal(err)
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	e.token = hex.EncodeToString(tok[:])
	// token,user,uid,"groups": the one user the static token file knows.
	tokens := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", e.token, AdminUser, AdminUser)
	if err := os.WriteFile(filepath.Join(e.dir, "tokens.csv"), []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}

	// Free ports are found by listening and closing, so another process
	// may take one before the server binds it: a server that exits at once
	// is started again on other ports.
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatal(err)
		}
		e.etcdPort, e.peerPort, e.apiPort = ports[0], ports[1], ports[2]
		err = e.startServers()
		if err == nil {
			break
		}
		var exited *exitedError
		if !errors.As(err, &exited) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("kubetest: %v; retrying on other ports", err)
	}

	host := "https://127.0.0.1:" + strconv.Itoa(e.apiPort)
	e.Config = &rest.Config{
		Host:            host,
		BearerToken:     e.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.pki.caPEM},
		// client-go's defaults (5 QPS, burst 10) throttle a test that
		// creates a few dozen objects at once for no purpose.
		QPS:   100,
		Burst: 200,
	}
	e.Kubeconfig = filepath.Join(e.dir, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: e.pki.caPEM}
	kc.AuthInfos[AdminUser] = &clientcmdapi.AuthInfo{Token: e.token}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: AdminUser}
	kc.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*kc, e.Kubeconfig); err != nil {
		t.Fatalf("kubetest: kubeconfig: %v", err)
	}
	return e
}

// EtcdURL is the client URL of the Env's etcd, for tests that look at what
// the apiserver stores (etcd's JSON gateway: /v3/kv/range).
func (e *Env) EtcdURL() string { return "http://127.0.0.1:" + strconv.Itoa(e.etcdPort) }

// Pids returns the process ids of the running etcd and kube-apiserver (0
// while stopped), for tests that measure what the servers cost
// (/proc/<pid>/stat).
func (e *Env) Pids() (etcd, apiserver int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.etcd != nil {
		etcd = e.etcd.cmd.Process.Pid
	}
	if e.api != nil {
		apiserver = e.api.cmd.Process.Pid
	}
	return etcd, apiserver
}

// binDir returns the binaries' directory, or skips or fails the test.
func binDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		t.Skipf("kubetest: %s is unset: run scripts/kube.sh and set %s to the directory it prints (scripts/test.sh does both)", BinDirEnv, BinDirEnv)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("kubetest: %s=%s has no %s: run scripts/kube.sh again (%v)", BinDirEnv, dir, b, err)
		}
	}
	return dir
}

// StopServers kills the apiserver and etcd (SIGKILL), as a crash or an
// outage would, keeping their data, ports and certificates for
// StartServers. Clients see refused connections meanwhile. (A graceful
// stop would be no quicker: an apiserver waits for its open watches.)
func (e *Env) StopServers(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range []*proc{e.api, e.etcd} {
		if p != nil {
			p.kill()
		}
	}
	e.api, e.etcd = nil, nil
}

// StartServers starts the servers StopServers stopped again, on the same
// ports and data, and waits until the apiserver is ready. Objects written
// before the outage are there again, with their resource versions.
func (e *Env) StartServers(t testing.TB) {
	t.Helper()
	if err := e.startServers(); err != nil {
		t.Fatal(err)
	}
}

func (e *Env) startServers() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.etcd != nil || e.api != nil {
		return errors.New("kubetest: servers already running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var err error
	if e.etcd, err = e.startEtcd(ctx); err != nil {
		return err
	}
	if e.api, err = e.startAPIServer(ctx); err != nil {
		e.stopLocked()
		return err
	}
	return nil
}

func (e *Env) startEtcd(ctx context.Context) (*proc, error) {
	client := "http://127.0.0.1:" + strconv.Itoa(e.etcdPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(e.peerPort)
	p, err := startProc(filepath.Join(e.binDir, "etcd"), filepath.Join(e.dir, "etcd.log"),
		"--name=kubetest",
		"--data-dir="+filepath.Join(e.dir, "etcd"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kubetest="+peer,
		// A test's data need not survive a power cut; fsyncs on a
		// shared disk would make every write wait for it.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	err = p.waitReady(ctx, func() bool {
		resp, err := hc.Get(client + "/health")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"health":"true"`)
	})
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (e *Env) startAPIServer(ctx context.Context) (*proc, error) {
	p, err := startProc(filepath.Join(e.binDir, "kube-apiserver"), filepath.Join(e.dir, "kube-apiserver.log"),
		"--etcd-servers=http://127.0.0.1:"+strconv.Itoa(e.etcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The endpoint reconciler publishes the advertise address as the
		// kubernetes Service's endpoint, and refuses a loopback one;
		// nothing here runs in a pod to use it.
		"--endpoint-reconciler-type=none",
		"--secure-port="+strconv.Itoa(e.apiPort),
		"--tls-cert-file="+e.pki.servingCert,
		"--tls-private-key-file="+e.pki.servingKey,
		// The apiserver writes nothing else of its own; keep it in the
		// Env's directory all the same.
		"--cert-dir="+filepath.Join(e.dir, "apiserver-certs"),
		"--token-auth-file="+filepath.Join(e.dir, "tokens.csv"),
		// RBAC alone, as a cluster that runs evalbox has it: the admin
		// passes as system:masters, every other user only by the Roles
		// a test binds.
		"--authorization-mode=RBAC",
		// ServiceAccount tokens (TokenRequest) signed by a key of the
		// Env's own, so tests can act as the ServiceAccounts that
		// deploy/kubernetes ships.
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+e.pki.saPub,
		"--service-account-signing-key-file="+e.pki.saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		// The node agent's DaemonSet is privileged: its dry-run must pass.
		"--allow-privileged=true",
		"--profiling=false",
	)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.pki.caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	url := "https://127.0.0.1:" + strconv.Itoa(e.apiPort) + "/readyz"
	err = p.waitReady(ctx, func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+e.token)
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// stopLocked stops the apiserver, then etcd (the apiserver's storage goes
// last, as in a clean shutdown).
func (e *Env) stopLocked() {
	if e.api != nil {
		e.api.stop()
		e.api = nil
	}
	if e.etcd != nil {
		e.etcd.stop()
		e.etcd = nil
	}
}

// cleanup stops whatever still runs and, when the test failed, logs the
// end of each server's log (the directory goes with the test).
func (e *Env) cleanup(t testing.TB) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
	if t.Failed() {
		for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
			if b, err := os.ReadFile(filepath.Join(e.dir, name)); err == nil {
				t.Logf("kubetest: the end of %s:\n%s", name, tail(b, 40))
			}
		}
	}
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePorts returns n distinct loopback ports that were free a moment ago:
// all n are held open together, so none is returned twice.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kubetest: free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// proc is one server process.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process exited and was reaped
	err  error         // its exit, once done
}

// exitedError is a server that exited before it was ready (a port taken, a
// bad flag): its log says why.
type exitedError struct {
	name, log string
	err       error
}

func (e *exitedError) Error() string {
	return fmt.Sprintf("kubetest: %s exited before it was ready (%v); the end of its log:\n%s", e.name, e.err, e.log)
}

// startProc starts bin with args, its output appended to logPath. The
// process dies with the test binary (Pdeathsig), so a test killed by its
// timeout leaves no server behind.
func startProc(bin, logPath string, args ...string) (*proc, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kubetest: starting %s: %w", filepath.Base(bin), err)
	}
	p := &proc{name: filepath.Base(bin), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady polls ready until it holds, the process exits, or ctx ends.
func (p *proc) waitReady(ctx context.Context, ready func() bool) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if ready() {
			return nil
		}
		select {
		case <-p.done:
			logPath := ""
			if f, ok := p.cmd.Stdout.(*os.File); ok {
				logPath = f.Name()
			}
			b, _ := os.ReadFile(logPath)
			return &exitedError{name: p.name, log: tail(b, 20), err: p.err}
		case <-ctx.Done():
			return fmt.Errorf("kubetest: %s not ready after %v: %w", p.name, startTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// stop ends the process by its pid: SIGTERM, and SIGKILL if it has not
// exited 10 s later. It returns once the process is reaped.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM) // an error: it exited already
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

// kill ends the process by its pid with SIGKILL and reaps it.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill() // an error: it exited already
	<-p.done
}
