package kubetest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestEnv starts an Env, uses it through Config and through Kubeconfig,
// restarts its servers, and checks that its end leaves no process and no
// file.
func TestEnv(t *testing.T) {
	var pids []int
	var dir string
	t.Run("Use", func(t *testing.T) {
		env := Start(t)
		pids = []int{env.etcd.cmd.Process.Pid, env.api.cmd.Process.Pid}
		dir = env.dir
		ctx := context.Background()

		cs, err := kubernetes.NewForConfig(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		v, err := cs.Discovery().ServerVersion()
		if err != nil {
			t.Fatal(err)
		}
		// scripts/kube.sh stamps the pinned version into the build.
		if !strings.HasPrefix(v.GitVersion, "v1.") || v.GitVersion == "v0.0.0-master+$Format:%H$" {
			t.Errorf("server version %q, want the pinned release", v.GitVersion)
		}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		kc, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cs2, err := kubernetes.NewForConfig(kc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs2.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err != nil {
			t.Fatalf("through the kubeconfig: %v", err)
		}

		env.StopServers(t)
		if _, err := cs.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err == nil {
			t.Fatal("the apiserver answers while stopped")
		}
		env.StartServers(t)
		if _, err := cs.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err != nil {
			t.Fatalf("after a restart: %v", err)
		}
		pids = append(pids, env.etcd.cmd.Process.Pid, env.api.cmd.Process.Pid)
	})
	for _, pid := range pids {
		// Reaped children: their pids no longer exist (or belong to
		// something else, which is not a server of ours).
		if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err == nil && (strings.Contains(string(b), "etcd") || strings.Contains(string(b), "kube-apiserver")) {
			t.Errorf("server process %d outlived its test: %q", pid, b)
		}
		if err := syscall.Kill(pid, 0); err == nil {
			t.Logf("pid %d exists again (reused)", pid)
		}
	}
	if dir != "" {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the Env's directory %s outlived its test: %v", dir, err)
		}
	}
}

func TestApplyFileDryRun(t *testing.T) {
	env := Start(t)
	path := filepath.Join(t.TempDir(), "objs.yaml")
	manifest := `apiVersion: v1
kind: Namespace
metadata:
  name: applied
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: applied
data:
  a: "1"
`
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// A dry run stores nothing; the ConfigMap's namespace does not exist
	// then, so only the Namespace can be dry-run alone.
	nsOnly := filepath.Join(t.TempDir(), "ns.yaml")
	if err := os.WriteFile(nsOnly, []byte(strings.SplitN(manifest, "---", 2)[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := env.ApplyFile(t, nsOnly, ApplyOptions{DryRun: true}); len(got) != 1 {
		t.Fatalf("dry run applied %d objects, want 1", len(got))
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "applied", metav1.GetOptions{}); err == nil {
		t.Fatal("a dry run stored the Namespace")
	}

	got := env.ApplyFile(t, path, ApplyOptions{})
	if len(got) != 2 {
		t.Fatalf("applied %d objects, want 2", len(got))
	}
	cm, err := cs.CoreV1().ConfigMaps("applied").Get(ctx, "settings", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["a"] != "1" {
		t.Errorf("ConfigMap data %v", cm.Data)
	}
	// Applied again: the same objects, no conflict with itself.
	env.ApplyFile(t, path, ApplyOptions{})
}

// TestApplyStrict: a field the schema lacks fails an apply, a dry run too
// (server-side apply refuses it whatever the field validation), and so
// does a field given twice, unless FieldValidation says otherwise; the
// answer names the field.
func TestApplyStrict(t *testing.T) {
	env := Start(t)
	ctx := context.Background()
	unknown := []byte(`apiVersion: v1
kind: ConfigMap
metadata:
  name: unknown
datta:
  a: "1"
`)
	twice := []byte(`apiVersion: v1
kind: ConfigMap
metadata:
  name: twice
data:
  a: "1"
data:
  a: "2"
`)
	for _, dry := range []bool{true, false} {
		if _, err := env.Apply(ctx, "unknown.yaml", unknown, ApplyOptions{DryRun: dry}); err == nil || !strings.Contains(err.Error(), ".datta: field not declared in schema") {
			t.Errorf("dry run %v: an unknown field: %v, want it refused by name", dry, err)
		}
		if _, err := env.Apply(ctx, "twice.yaml", twice, ApplyOptions{DryRun: dry}); err == nil || !strings.Contains(err.Error(), `"data"`) {
			t.Errorf("dry run %v: a field given twice: %v, want it refused by name", dry, err)
		}
	}
	if _, err := env.Apply(ctx, "twice.yaml", twice, ApplyOptions{DryRun: true, FieldValidation: metav1.FieldValidationIgnore}); err != nil {
		t.Errorf("a field given twice with FieldValidation Ignore: %v", err)
	}
}
