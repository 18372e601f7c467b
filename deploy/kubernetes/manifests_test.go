// Package kubernetes_test checks the manifests of deploy/kubernetes as
// users get them: built by kustomize (the pinned sigs.k8s.io/kustomize/api,
// what `kubectl apply -k` runs), then held against what evalbox needs of
// them (TestManifests) and server-side applied to a real kube-apiserver
// with strict field validation (TestManifestsOnAPIServer), where the
// ServiceAccounts they ship are put to the test with tokens of their own.
package kubernetes_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/evalbox/evalbox/internal/cli"
	"github.com/evalbox/evalbox/internal/kubetest"
)

const ns = "evalbox"

// The image every container names, and what the kustomization makes of it.
const (
	imageName = "evalbox"
	imageRef  = "evalbox:latest"
)

// The ServiceAccounts, and the only thing each may do (rbac.yaml).
var leaseVerbs = map[string][]string{
	"evalbox-node": {"create", "delete", "get", "list", "update", "watch"},
	"evalbox-api":  {"get", "list", "watch"},
}

// The flags the manifests may pass, by command, that docs/design/fleet.md
// defines and the command may not have yet (it is built apart from the
// manifests). A flag the command has is checked on the command itself;
// one it lacks must be in this list.
var designFlags = map[string][]string{
	"node": {"listen", "health-listen", "node-id", "advertise", "token-file", "tls-cert", "tls-key", "tls-client-ca",
		"insecure", "kubeconfig", "namespace", "lease-duration", "control-plane", "data-dir", "templates-dir", "runtimes",
		"pids", "host-pids", "host-reserve-pids", "host-reserve-memory-mb", "memory-overcommit", "cgroup-parent"},
	"serve": {"nodes", "kubeconfig", "namespace", "node-token-file", "node-tls-ca", "node-tls-cert", "node-tls-key", "replica-id"},
}

// objects is a build's output, by "Kind/name".
type objects map[string]*unstructured.Unstructured

func (o objects) typed(t *testing.T, key string, into any) {
	t.Helper()
	u, ok := o[key]
	if !ok {
		t.Fatalf("no %s in the build (have %v)", key, slices.Sorted(maps.Keys(o)))
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
}

func (o objects) daemonSet(t *testing.T) *appsv1.DaemonSet {
	var ds appsv1.DaemonSet
	o.typed(t, "DaemonSet/evalbox-node", &ds)
	return &ds
}

func (o objects) deployment(t *testing.T) *appsv1.Deployment {
	var d appsv1.Deployment
	o.typed(t, "Deployment/evalbox-api", &d)
	return &d
}

// podTemplates returns the pod templates of the build's workloads.
func (o objects) podTemplates(t *testing.T) map[string]*corev1.PodTemplateSpec {
	return map[string]*corev1.PodTemplateSpec{
		"DaemonSet/evalbox-node": &o.daemonSet(t).Spec.Template,
		"Deployment/evalbox-api": &o.deployment(t).Spec.Template,
	}
}

// build runs kustomize on dir of fsys and returns its YAML and objects.
func build(t *testing.T, fsys filesys.FileSystem, dir string) ([]byte, objects) {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs := objects{}
	dec := k8syaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var u unstructured.Unstructured
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("kustomize build %s: its output: %v", dir, err)
		}
		key := u.GetKind() + "/" + u.GetName()
		if objs[key] != nil {
			t.Fatalf("%s twice in the build", key)
		}
		objs[key] = &u
	}
	return out, objs
}

func buildBase(t *testing.T) ([]byte, objects) {
	return build(t, filesys.MakeFsOnDisk(), ".")
}

// overlay is what docs/deploy-kubernetes.md tells users to write: their
// image, and their Secrets (from files kept out of git) in place of the
// placeholders.
const overlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../base
images:
  - name: evalbox
    newName: registry.example.com/team/evalbox
    newTag: v1.2.3
secretGenerator:
  - name: evalbox-postgres
    namespace: evalbox
    behavior: replace
    literals:
      - url=postgres://evalbox@db.internal:5432/evalbox?sslmode=verify-full
    files:
      - password=secrets/pg-password
  - name: evalbox-node-token
    namespace: evalbox
    behavior: replace
    files:
      - token=secrets/node-token
  - name: evalbox-secrets-keys
    namespace: evalbox
    behavior: replace
    files:
      - secrets.keys=secrets/secrets.keys
  - name: evalbox-node-tls
    namespace: evalbox
    behavior: replace
    files:
      - ca.crt=certs/ca.crt
      - tls.crt=certs/node.crt
      - tls.key=certs/node.key
  - name: evalbox-api-tls
    namespace: evalbox
    behavior: replace
    files:
      - ca.crt=certs/ca.crt
      - tls.crt=certs/api.crt
      - tls.key=certs/api.key
`

// overlayNoSecrets is the page's other overlay: the Secrets are managed
// elsewhere, and the placeholders dropped from the build.
const overlayNoSecrets = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../base
patches:
  - patch: |-
      $patch: delete
      apiVersion: v1
      kind: Secret
      metadata: {name: evalbox-postgres, namespace: evalbox}
  - patch: |-
      $patch: delete
      apiVersion: v1
      kind: Secret
      metadata: {name: evalbox-node-token, namespace: evalbox}
  - patch: |-
      $patch: delete
      apiVersion: v1
      kind: Secret
      metadata: {name: evalbox-secrets-keys, namespace: evalbox}
  - patch: |-
      $patch: delete
      apiVersion: v1
      kind: Secret
      metadata: {name: evalbox-node-tls, namespace: evalbox}
  - patch: |-
      $patch: delete
      apiVersion: v1
      kind: Secret
      metadata: {name: evalbox-api-tls, namespace: evalbox}
`

// buildOverlay builds kustomization over a copy of this directory, in
// memory, with the secret files the page makes.
func buildOverlay(t *testing.T, kustomization string) ([]byte, objects) {
	t.Helper()
	fsys := filesys.MakeFsInMemory()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := fsys.WriteFile(path.Join("/base", f), b); err != nil {
			t.Fatal(err)
		}
	}
	overlayFiles := map[string]string{
		"/overlay/kustomization.yaml":   kustomization,
		"/overlay/secrets/node-token":   "0123456789abcdef0123456789abcdef\n",
		"/overlay/secrets/pg-password":  "from-the-overlay",
		"/overlay/secrets/secrets.keys": `{"current":1,"keys":{"1":"` + strings.Repeat("A", 43) + `="}}`,
	}
	for name, content := range fleetCerts(t) {
		overlayFiles["/overlay/certs/"+name] = string(content)
	}
	for name, content := range overlayFiles {
		if err := fsys.WriteFile(name, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	return build(t, fsys, "/overlay")
}

// TestManifests checks the build's objects for what evalbox needs of them,
// without an API server.
func TestManifests(t *testing.T) {
	_, objs := buildBase(t)

	t.Run("EveryFileListed", func(t *testing.T) {
		b, err := os.ReadFile("kustomization.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var k types.Kustomization
		if err := yaml.UnmarshalStrict(b, &k); err != nil {
			t.Fatal(err)
		}
		files, _ := filepath.Glob("*.yaml")
		files = slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" })
		if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, files) {
			t.Errorf("kustomization resources %v, want every manifest of the directory %v", got, files)
		}
		if len(k.Images) != 1 || k.Images[0].Name != imageName {
			t.Errorf("kustomization images %+v, want the one image %q", k.Images, imageName)
		}
	})

	t.Run("Objects", func(t *testing.T) {
		want := []string{
			"DaemonSet/evalbox-node", "Deployment/evalbox-api", "Namespace/evalbox", "NetworkPolicy/evalbox-api", "NetworkPolicy/evalbox-node",
			"Role/evalbox-api", "Role/evalbox-node", "RoleBinding/evalbox-api", "RoleBinding/evalbox-node",
			"Secret/evalbox-api-tls", "Secret/evalbox-node-tls", "Secret/evalbox-node-token", "Secret/evalbox-postgres", "Secret/evalbox-secrets-keys", "Service/evalbox-api",
			"ServiceAccount/evalbox-api", "ServiceAccount/evalbox-node",
		}
		if got := slices.Sorted(maps.Keys(objs)); !slices.Equal(got, want) {
			t.Errorf("objects %v, want %v", got, want)
		}
		for key, u := range objs {
			if u.GetKind() != "Namespace" && u.GetNamespace() != ns {
				t.Errorf("%s in namespace %q, want %q", key, u.GetNamespace(), ns)
			}
			if u.GetLabels()["app.kubernetes.io/name"] != "evalbox" {
				t.Errorf("%s lacks the label app.kubernetes.io/name=evalbox", key)
			}
		}
	})

	t.Run("Images", func(t *testing.T) {
		for key, pt := range objs.podTemplates(t) {
			for _, c := range containers(pt) {
				if c.Image != imageRef {
					t.Errorf("%s container %s: image %q, want %q (the kustomization's images: entry)", key, c.Name, c.Image, imageRef)
				}
			}
		}
	})

	t.Run("Overlay", func(t *testing.T) {
		_, over := buildOverlay(t, overlay)
		for key, pt := range over.podTemplates(t) {
			for _, c := range containers(pt) {
				if c.Image != "registry.example.com/team/evalbox:v1.2.3" {
					t.Errorf("%s container %s: image %q after the overlay's images:, want the overlay's", key, c.Name, c.Image)
				}
			}
		}
		// The generated Secrets replace the placeholders, and every
		// reference follows them.
		secrets := map[string]*corev1.Secret{}
		for key, u := range over {
			if u.GetKind() == "Secret" {
				var s corev1.Secret
				over.typed(t, key, &s)
				secrets[s.Name] = &s
			}
		}
		checkSecretRefs(t, over, secrets)
		for _, s := range secrets {
			for k, v := range s.Data {
				if strings.Contains(string(v), "REPLACE-ME") {
					t.Errorf("Secret %s key %s is still the placeholder after the overlay", s.Name, k)
				}
			}
		}
		if len(secrets) != 5 || string(secrets[findSecret(secrets, "evalbox-postgres")].Data["password"]) != "from-the-overlay" {
			t.Errorf("the overlay's Secrets: %v", slices.Sorted(maps.Keys(secrets)))
		}

		// Without the Secrets, the workloads still name them.
		_, bare := buildOverlay(t, overlayNoSecrets)
		for key := range bare {
			if strings.HasPrefix(key, "Secret/") {
				t.Errorf("%s in the build of the overlay that drops the Secrets", key)
			}
		}
		env := bare.deployment(t).Spec.Template.Spec.Containers[0]
		if envSecret(env, "EVALBOX_DATABASE") != "evalbox-postgres/url" {
			t.Errorf("without the Secrets in the build, EVALBOX_DATABASE comes from %q", envSecret(env, "EVALBOX_DATABASE"))
		}
	})

	t.Run("Requests", func(t *testing.T) {
		for key, pt := range objs.podTemplates(t) {
			for _, c := range containers(pt) {
				for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
						t.Errorf("%s container %s requests no %s", key, c.Name, r)
					}
				}
			}
		}
	})

	t.Run("APINonRoot", func(t *testing.T) {
		pod := objs.deployment(t).Spec.Template.Spec
		psc := pod.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
			t.Errorf("API pod security context %+v, want runAsNonRoot and a non-zero runAsUser", psc)
		}
		if pod.HostPID || pod.HostNetwork || pod.HostIPC {
			t.Error("API pod shares a host namespace")
		}
		for _, v := range pod.Volumes {
			if v.HostPath != nil {
				t.Errorf("API pod mounts host path %s", v.HostPath.Path)
			}
		}
		for _, c := range containers(&objs.deployment(t).Spec.Template) {
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("API container %s has no security context", c.Name)
			case sc.Privileged != nil && *sc.Privileged:
				t.Errorf("API container %s is privileged", c.Name)
			case sc.RunAsUser != nil && *sc.RunAsUser == 0:
				t.Errorf("API container %s runs as root", c.Name)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("API container %s has a writable root filesystem", c.Name)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("API container %s may gain privileges", c.Name)
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
				t.Errorf("API container %s capabilities %+v, want all dropped and none added", c.Name, sc.Capabilities)
			}
		}
	})

	t.Run("Node", func(t *testing.T) {
		ds := objs.daemonSet(t)
		pod := ds.Spec.Template.Spec
		if pod.ServiceAccountName != "evalbox-node" {
			t.Errorf("node service account %q", pod.ServiceAccountName)
		}
		if pod.HostPID || pod.HostNetwork || pod.HostIPC {
			t.Error("node pod shares a host namespace; node.yaml says why it needs none")
		}
		if g := pod.TerminationGracePeriodSeconds; g == nil || *g < 60 {
			t.Errorf("node termination grace %v, want at least 60 s to destroy a host's sandboxes", g)
		}
		hostPaths := map[string]string{} // path → where mounted
		for _, v := range pod.Volumes {
			if v.HostPath != nil {
				hostPaths[v.HostPath.Path] = mountOf(pod.Containers[0], v.Name)
			}
		}
		want := map[string]string{"/sys/fs/cgroup": "/sys/fs/cgroup", "/var/lib/evalbox-node": "/var/lib/evalbox-node", "/run/evalbox": "/run/evalbox"}
		if !maps.Equal(hostPaths, want) {
			t.Errorf("node host paths (host → container) %v, want %v", hostPaths, want)
		}
		c := pod.Containers[0]
		if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
			t.Errorf("node container not privileged: %+v", c.SecurityContext)
		}
		if got := flagValue(c.Args, "data-dir"); got != want["/var/lib/evalbox-node"] {
			t.Errorf("node --data-dir %q, want the host path's mount", got)
		}
		if got := flagValue(c.Args, "node-id"); got != "$(NODE_NAME)" || envField(c, "NODE_NAME") != "spec.nodeName" {
			t.Errorf("node --node-id %q (NODE_NAME from %q), want the Kubernetes node's name", got, envField(c, "NODE_NAME"))
		}
		if got := flagValue(c.Args, "advertise"); got != "$(POD_IP):7070" || envField(c, "POD_IP") != "status.podIP" {
			t.Errorf("node --advertise %q (POD_IP from %q), want the pod IP and the gRPC port", got, envField(c, "POD_IP"))
		}
		if port, ok := containerPort(c, "grpc"); !ok || ":"+fmt.Sprint(port) != flagValue(c.Args, "listen") {
			t.Errorf("node gRPC port %d, --listen %q", port, flagValue(c.Args, "listen"))
		}
		// --control-plane is https to the API Service's nodes port, which
		// reaches the API's --node-listen.
		u, err := url.Parse(flagValue(c.Args, "control-plane"))
		var svc corev1.Service
		objs.typed(t, "Service/evalbox-api", &svc)
		if err != nil || u.Scheme != "https" || u.Hostname() != svc.Name+"."+svc.Namespace+".svc" {
			t.Errorf("node --control-plane %q, want https to the Service evalbox-api", flagValue(c.Args, "control-plane"))
		}
		api := objs.deployment(t).Spec.Template.Spec.Containers[0]
		found := false
		for _, p := range svc.Spec.Ports {
			if u != nil && fmt.Sprint(p.Port) == u.Port() {
				port, ok := containerPort(api, p.TargetPort.String())
				found = ok && ":"+fmt.Sprint(port) == flagValue(api.Args, "node-listen") && p.Name == "nodes"
			}
		}
		if !found {
			t.Errorf("node --control-plane %q does not reach the API's --node-listen %q through the Service's nodes port", flagValue(c.Args, "control-plane"), flagValue(api.Args, "node-listen"))
		}
		if ds.Spec.UpdateStrategy.RollingUpdate == nil || ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge == nil || ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge.IntValue() != 0 {
			t.Error("node DaemonSet may surge: two agents would share a host's data dir")
		}
	})

	t.Run("API", func(t *testing.T) {
		d := objs.deployment(t)
		pod := d.Spec.Template.Spec
		if pod.ServiceAccountName != "evalbox-api" {
			t.Errorf("API service account %q", pod.ServiceAccountName)
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			t.Errorf("API replicas %v, want 2", d.Spec.Replicas)
		}
		c := pod.Containers[0]
		if flagValue(c.Args, "nodes") != "kubernetes" || flagValue(c.Args, "namespace") != "$(POD_NAMESPACE)" || envField(c, "POD_NAMESPACE") != "metadata.namespace" {
			t.Errorf("API args %q: want --nodes kubernetes in the pod's namespace", c.Args)
		}
		if flagValue(c.Args, "database") != "$(EVALBOX_DATABASE)" || envSecret(c, "EVALBOX_DATABASE") != "evalbox-postgres/url" || envSecret(c, "PGPASSWORD") != "evalbox-postgres/password" {
			t.Errorf("API database: --database %q, EVALBOX_DATABASE from %q, PGPASSWORD from %q", flagValue(c.Args, "database"), envSecret(c, "EVALBOX_DATABASE"), envSecret(c, "PGPASSWORD"))
		}
		// The Service reaches the API's pods (and only those) on its port.
		var svc corev1.Service
		objs.typed(t, "Service/evalbox-api", &svc)
		if !selects(svc.Spec.Selector, d.Spec.Template.Labels) || selects(svc.Spec.Selector, objs.daemonSet(t).Spec.Template.Labels) {
			t.Errorf("Service selector %v: want the API's pods, not the nodes'", svc.Spec.Selector)
		}
		if len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[1].Name != "nodes" || svc.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("Service ports %+v, want ClusterIP 8080 and the nodes port", svc.Spec.Ports)
		}
		if port, ok := containerPort(c, svc.Spec.Ports[0].TargetPort.String()); !ok || ":"+fmt.Sprint(port) != flagValue(c.Args, "listen") {
			t.Errorf("Service target port %s: container port %d, --listen %q", svc.Spec.Ports[0].TargetPort.String(), port, flagValue(c.Args, "listen"))
		}
	})

	t.Run("Probes", func(t *testing.T) {
		for key, pt := range objs.podTemplates(t) {
			c := pt.Spec.Containers[0]
			// Each probe asks the port the server listens on.
			listenFlag, readyPath, livePath := "listen", "/v1/health", "/v1/health"
			if key == "DaemonSet/evalbox-node" {
				listenFlag, readyPath, livePath = "health-listen", "/readyz", "/healthz"
			}
			for _, p := range []struct {
				name  string
				probe *corev1.Probe
				path  string
			}{{"readiness", c.ReadinessProbe, readyPath}, {"liveness", c.LivenessProbe, livePath}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("%s: no HTTP %s probe", key, p.name)
					continue
				}
				port, ok := containerPort(c, p.probe.HTTPGet.Port.String())
				if p.probe.HTTPGet.Path != p.path || !ok || ":"+fmt.Sprint(port) != flagValue(c.Args, listenFlag) {
					t.Errorf("%s: %s probe %s on port %s (%d), want %s on --%s %q", key, p.name, p.probe.HTTPGet.Path,
						p.probe.HTTPGet.Port.String(), port, p.path, listenFlag, flagValue(c.Args, listenFlag))
				}
			}
		}
	})

	t.Run("Flags", func(t *testing.T) {
		root := cli.NewRoot()
		for key, pt := range objs.podTemplates(t) {
			c := pt.Spec.Containers[0]
			if len(c.Args) == 0 {
				t.Fatalf("%s: no args", key)
			}
			sub := c.Args[0]
			cmd, _, err := root.Find([]string{sub})
			built := err == nil && cmd.Name() == sub
			for _, a := range c.Args[1:] {
				name, _, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if !ok || !strings.HasPrefix(a, "--") {
					t.Errorf("%s: argument %q, want --flag=value", key, a)
					continue
				}
				if built && cmd.Flags().Lookup(name) != nil {
					continue
				}
				if !slices.Contains(designFlags[sub], name) {
					t.Errorf("%s: evalbox %s has no flag --%s (neither the command nor docs/design/fleet.md)", key, sub, name)
				}
			}
		}
	})

	t.Run("EnvReferences", func(t *testing.T) {
		ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
		for key, pt := range objs.podTemplates(t) {
			for _, c := range containers(pt) {
				defined := map[string]bool{}
				for _, e := range c.Env {
					defined[e.Name] = true
				}
				for _, a := range append(slices.Clone(c.Command), c.Args...) {
					for _, m := range ref.FindAllStringSubmatch(a, -1) {
						// Kubernetes leaves an undefined $(VAR) as it is:
						// the server would get the text "$(VAR)".
						if !defined[m[1]] {
							t.Errorf("%s container %s: %q refers to $(%s), which its env does not define", key, c.Name, a, m[1])
						}
					}
				}
			}
		}
	})

	t.Run("TLS", func(t *testing.T) {
		// Every TLS file is a key of its side's Secret, and the
		// certificates scripts/fleet-certs.sh makes fit the flags: the
		// nodes' holds the name the replicas check, the API's the host the
		// nodes fetch from; both chain to the CA each side trusts, and
		// serve and authenticate as clients.
		pts := objs.podTemplates(t)
		for key, files := range map[string]struct {
			secret string
			flags  map[string]string // flag → Secret key
		}{
			"DaemonSet/evalbox-node": {"evalbox-node-tls", map[string]string{"tls-cert": "tls.crt", "tls-key": "tls.key", "tls-client-ca": "ca.crt", "control-plane-ca": "ca.crt"}},
			"Deployment/evalbox-api": {"evalbox-api-tls", map[string]string{"node-tls-cert": "tls.crt", "node-tls-key": "tls.key", "node-tls-ca": "ca.crt"}},
		} {
			pt := pts[key]
			c := pt.Spec.Containers[0]
			for flag, k := range files.flags {
				if file := flagValue(c.Args, flag); !mountedFromSecret(pt, c, file, files.secret, k) {
					t.Errorf("%s: --%s %q is not the %s key of a mount of Secret %s", key, flag, file, k, files.secret)
				}
			}
		}
		certs := fleetCerts(t)
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(certs["ca.crt"]) {
			t.Fatal("fleet-certs.sh: ca.crt holds no certificate")
		}
		nodeArgs := pts["DaemonSet/evalbox-node"].Spec.Containers[0].Args
		apiArgs := pts["Deployment/evalbox-api"].Spec.Containers[0].Args
		u, err := url.Parse(flagValue(nodeArgs, "control-plane"))
		if err != nil {
			t.Fatal(err)
		}
		for name, host := range map[string]string{"node": flagValue(apiArgs, "node-tls-server-name"), "api": u.Hostname()} {
			if host == "" {
				t.Errorf("no name to check the %s certificate against", name)
				continue
			}
			pair, err := tls.X509KeyPair(certs[name+".crt"], certs[name+".key"])
			if err != nil {
				t.Fatalf("fleet-certs.sh %s: %v", name, err)
			}
			leaf, err := x509.ParseCertificate(pair.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("fleet-certs.sh's %s certificate for %q (usage %v): %v", name, host, usage, err)
				}
			}
		}
	})

	t.Run("TokenFile", func(t *testing.T) {
		for key, flag := range map[string]string{"DaemonSet/evalbox-node": "token-file", "Deployment/evalbox-api": "node-token-file"} {
			pt := objs.podTemplates(t)[key]
			c := pt.Spec.Containers[0]
			file := flagValue(c.Args, flag)
			if !mountedFromSecret(pt, c, file, "evalbox-node-token", "token") {
				t.Errorf("%s: --%s %q is not the token key of a mount of Secret evalbox-node-token", key, flag, file)
			}
		}
	})

	t.Run("SecretsKeys", func(t *testing.T) {
		pt := objs.podTemplates(t)["Deployment/evalbox-api"]
		c := pt.Spec.Containers[0]
		file := flagValue(c.Args, "secrets-keys")
		if !mountedFromSecret(pt, c, file, "evalbox-secrets-keys", "secrets.keys") {
			t.Errorf("serve --secrets-keys %q is not the secrets.keys key of a mount of Secret evalbox-secrets-keys", file)
		}
	})

	t.Run("Secrets", func(t *testing.T) {
		secrets := map[string]*corev1.Secret{}
		for _, name := range []string{"evalbox-postgres", "evalbox-node-token", "evalbox-secrets-keys", "evalbox-node-tls", "evalbox-api-tls"} {
			var s corev1.Secret
			objs.typed(t, "Secret/"+name, &s)
			secrets[name] = &s
			for k, v := range s.StringData {
				if !strings.Contains(v, "REPLACE-ME") && k != "url" {
					t.Errorf("Secret %s key %s holds %q, not a placeholder", name, k, v)
				}
			}
		}
		u, err := url.Parse(secrets["evalbox-postgres"].StringData["url"])
		if err != nil {
			t.Fatal(err)
		}
		host := u.Hostname()
		if _, pw := u.User.Password(); pw || u.Query().Has("password") || !strings.HasSuffix(host, ".invalid") || net.ParseIP(host) != nil {
			t.Errorf("placeholder database URL %q: want no password (it goes on the command line) and a .invalid host", u.Redacted())
		}
		if u.Query().Get("sslmode") != "verify-full" {
			t.Errorf("placeholder database URL %q: want sslmode=verify-full", u.Redacted())
		}
		checkSecretRefs(t, objs, secrets)
	})

	t.Run("RBAC", func(t *testing.T) {
		for key, u := range objs {
			switch u.GetKind() {
			case "ClusterRole", "ClusterRoleBinding":
				t.Errorf("%s: evalbox needs nothing cluster-wide", key)
			case "Role":
				rules, _, _ := unstructured.NestedSlice(u.Object, "rules")
				for _, r := range rules {
					b, _ := json.Marshal(r)
					if s := string(b); strings.Contains(s, "secrets") || strings.Contains(s, "'*'") || strings.Contains(s, `"*"`) {
						t.Errorf("%s grants %s", key, s)
					}
				}
			}
		}
	})
}

// TestManifestsOnAPIServer applies the build to a real API server: every
// object by server-side apply with strict field validation, as a dry run
// and then for real (the Namespace and RBAC first, so that the namespaced
// dry runs have a namespace); the documented overlay as a dry run; the
// pods as Pod Security admission judges them; and the ServiceAccounts with
// tokens the server issues them, which may do nothing but their Leases.
func TestManifestsOnAPIServer(t *testing.T) {
	env := kubetest.Start(t)
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	all, objs := buildBase(t)

	// The Namespace alone, as a dry run: it stores nothing.
	nsYAML := toYAML(t, objs["Namespace/evalbox"])
	if _, err := env.Apply(ctx, "namespace", nsYAML, kubetest.ApplyOptions{DryRun: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after a dry run, the namespace: %v, want not found", err)
	}
	var base []byte
	for _, key := range []string{"Namespace/evalbox", "ServiceAccount/evalbox-node", "ServiceAccount/evalbox-api",
		"Role/evalbox-node", "Role/evalbox-api", "RoleBinding/evalbox-node", "RoleBinding/evalbox-api"} {
		base = append(base, toYAML(t, objs[key])...)
	}
	if _, err := env.Apply(ctx, "namespace and RBAC", base, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}

	dry, err := env.Apply(ctx, "kustomize build", all, kubetest.ApplyOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(dry) != len(objs) {
		t.Fatalf("dry run applied %d objects of %d", len(dry), len(objs))
	}
	if _, err := admin.AppsV1().DaemonSets(ns).Get(ctx, "evalbox-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after a dry run, the DaemonSet: %v, want not found", err)
	}
	for name, k := range map[string]string{"the overlay": overlay, "the overlay without Secrets": overlayNoSecrets} {
		overlaid, _ := buildOverlay(t, k)
		if _, err := env.Apply(ctx, name, overlaid, kubetest.ApplyOptions{DryRun: true}); err != nil {
			t.Fatal(err)
		}
	}
	// For real, twice: a second apply of the same files changes nothing
	// and conflicts with nothing.
	for range 2 {
		if _, err := env.Apply(ctx, "kustomize build", all, kubetest.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("PodSecurity", func(t *testing.T) {
		// The API's pods meet the restricted level; the node's need the
		// privileged namespace they are given.
		restricted := "evalbox-restricted"
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: restricted, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, sa := range []string{"evalbox-api", "evalbox-node"} {
			if _, err := admin.CoreV1().ServiceAccounts(restricted).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pts := objs.podTemplates(t)
		dryRunPod := func(key, namespace string) error {
			pt := pts[key]
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "check", Namespace: namespace, Labels: pt.Labels}, Spec: pt.Spec}
			pod.Spec.NodeName = "" // scheduling is not the question
			_, err := admin.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}
		if err := dryRunPod("Deployment/evalbox-api", restricted); err != nil {
			t.Errorf("an API pod in a restricted namespace: %v", err)
		}
		if err := dryRunPod("DaemonSet/evalbox-node", restricted); !apierrors.IsForbidden(err) {
			t.Errorf("a node pod in a restricted namespace: %v, want forbidden (it is privileged)", err)
		}
		for key := range pts {
			if err := dryRunPod(key, ns); err != nil {
				t.Errorf("%s's pod in namespace %s: %v", key, ns, err)
			}
		}
	})

	t.Run("LeastPrivilege", func(t *testing.T) {
		// A ServiceAccount bound to nothing: what every one may do.
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "unbound"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		baseline := serviceAccount(t, env, admin, "unbound")
		for sa, verbs := range leaseVerbs {
			t.Run(sa, func(t *testing.T) {
				cs := serviceAccount(t, env, admin, sa)
				// All it may do, as the server sums up its roles.
				for _, namespace := range []string{ns, "kube-node-lease", "kube-system", "default"} {
					checkRules(t, cs, baseline, sa, namespace, verbs)
				}
				forbidden := func(what string, err error) {
					t.Helper()
					if !apierrors.IsForbidden(err) {
						t.Errorf("%s %s: %v, want forbidden", sa, what, err)
					}
				}
				for _, s := range []string{"evalbox-node-token", "evalbox-postgres"} {
					_, err := cs.CoreV1().Secrets(ns).Get(ctx, s, metav1.GetOptions{})
					forbidden("gets Secret "+s, err)
				}
				_, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
				forbidden("lists Secrets", err)
				_, err = cs.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{})
				forbidden("watches Secrets", err)
				_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "escape"},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
				forbidden("creates a Pod", err)
				_, err = cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
				forbidden("lists ConfigMaps", err)
				_, err = cs.AppsV1().DaemonSets(ns).Get(ctx, "evalbox-node", metav1.GetOptions{})
				forbidden("gets the DaemonSet", err)
				// The kubelets' own heartbeats live in kube-node-lease:
				// a node agent must not be able to fake or end one.
				_, err = cs.CoordinationV1().Leases("kube-node-lease").Create(ctx, lease("forged"), metav1.CreateOptions{})
				forbidden("creates a kubelet's Lease", err)
				_, err = cs.CoordinationV1().Leases("kube-node-lease").List(ctx, metav1.ListOptions{})
				forbidden("lists the kubelets' Leases", err)

				// What it may do, it can.
				leases := cs.CoordinationV1().Leases(ns)
				if _, err := leases.List(ctx, metav1.ListOptions{}); err != nil {
					t.Errorf("%s lists its namespace's Leases: %v", sa, err)
				}
				_, err = leases.Create(ctx, lease(sa+"-check"), metav1.CreateOptions{})
				if slices.Contains(verbs, "create") {
					if err != nil {
						t.Errorf("%s creates a Lease: %v", sa, err)
					} else if err := leases.Delete(ctx, sa+"-check", metav1.DeleteOptions{}); err != nil {
						t.Errorf("%s deletes its Lease: %v", sa, err)
					}
				} else {
					forbidden("creates a Lease", err)
				}
			})
		}
	})
}

// rules returns what the ServiceAccount may do in namespace, as the server
// sums up its roles: one "group/resource verb" string per grant, resource
// names and non-resource URLs included.
func rules(t *testing.T, cs kubernetes.Interface, namespace string) []string {
	t.Helper()
	r, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(context.Background(),
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("rules review in %s: %v", namespace, err)
	}
	if r.Status.Incomplete {
		t.Fatalf("rules review in %s incomplete: %s", namespace, r.Status.EvaluationError)
	}
	var out []string
	for _, rule := range r.Status.ResourceRules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					s := g + "/" + res + " " + v
					if len(rule.ResourceNames) > 0 {
						s += " " + fmt.Sprint(rule.ResourceNames)
					}
					out = append(out, s)
				}
			}
		}
	}
	for _, rule := range r.Status.NonResourceRules {
		for _, u := range rule.NonResourceURLs {
			for _, v := range rule.Verbs {
				out = append(out, u+" "+v)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkRules checks that the ServiceAccount may do in namespace what a
// ServiceAccount bound to nothing may (review its own access, discovery,
// the public CA bundles: the cluster's defaults, whatever its version), and
// beyond that only verbs on Leases, and in evalbox's namespace only.
func checkRules(t *testing.T, cs, baseline kubernetes.Interface, sa, namespace string, verbs []string) {
	t.Helper()
	base := rules(t, baseline, namespace)
	var extra []string
	for _, r := range rules(t, cs, namespace) {
		if !slices.Contains(base, r) {
			extra = append(extra, r)
		}
	}
	var want []string
	if namespace == ns {
		for _, v := range verbs {
			want = append(want, "coordination.k8s.io/leases "+v)
		}
	}
	if !slices.Equal(extra, want) {
		t.Errorf("%s may, in %s, beyond what every ServiceAccount may: %q; want %q", sa, namespace, extra, want)
	}
}

// serviceAccount returns a client that authenticates as ServiceAccount
// ns/name by a token the server issues it, trusting the server's CA and
// nothing of the admin's.
func serviceAccount(t *testing.T, env *kubetest.Env, admin kubernetes.Interface, name string) kubernetes.Interface {
	t.Helper()
	ttl := int64(3600)
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for %s/%s: %v", ns, name, err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tok.Status.Token
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func lease(name string) *coordinationv1.Lease {
	holder, secs := name, int32(15)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs}}
}

func toYAML(t *testing.T, u *unstructured.Unstructured) []byte {
	t.Helper()
	if u == nil {
		t.Fatal("no such object in the build")
	}
	b, err := yaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte("---\n"), b...)
}

// checkSecretRefs checks that every Secret a pod template names (env, volume)
// is in secrets, with the key it names.
func checkSecretRefs(t *testing.T, objs objects, secrets map[string]*corev1.Secret) {
	t.Helper()
	has := func(name, key string) bool {
		s := secrets[name]
		if s == nil {
			return false
		}
		_, inData := s.Data[key]
		_, inString := s.StringData[key]
		return inData || inString
	}
	for key, pt := range objs.podTemplates(t) {
		for _, c := range containers(pt) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !has(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key) {
					t.Errorf("%s container %s: env %s from Secret %s key %s, which the build lacks", key, c.Name, e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
				}
			}
		}
		for _, v := range pt.Spec.Volumes {
			if v.Secret != nil && secrets[v.Secret.SecretName] == nil {
				t.Errorf("%s: volume %s from Secret %s, which the build lacks", key, v.Name, v.Secret.SecretName)
			}
		}
	}
}

// mountedFromSecret reports whether file is key of Secret secret as c
// mounts it (a secret volume mounted whole, read-only).
func mountedFromSecret(pt *corev1.PodTemplateSpec, c corev1.Container, file, secret, key string) bool {
	for _, v := range pt.Spec.Volumes {
		if v.Secret == nil || v.Secret.SecretName != secret || len(v.Secret.Items) > 0 {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == v.Name && m.ReadOnly && m.SubPath == "" && path.Join(m.MountPath, key) == file {
				return true
			}
		}
	}
	return false
}

// findSecret returns the name of the Secret generated from name (kustomize
// suffixes a hash of its content).
func findSecret(secrets map[string]*corev1.Secret, name string) string {
	for n := range secrets {
		if strings.HasPrefix(n, name+"-") || n == name {
			return n
		}
	}
	return ""
}

func containers(pt *corev1.PodTemplateSpec) []corev1.Container {
	return append(slices.Clone(pt.Spec.InitContainers), pt.Spec.Containers...)
}

// flagValue returns the value of --name=value in args ("" if absent).
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func mountOf(c corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

// envField returns the downward-API field an env variable comes from.
func envField(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}

// envSecret returns "secret/key" of an env variable from a Secret.
func envSecret(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	return ""
}

// containerPort resolves a probe's or Service's port (a name or a number)
// to a port the container declares.
func containerPort(c corev1.Container, port string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == port || fmt.Sprint(p.ContainerPort) == port {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// selects reports whether selector matches labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// fleetCerts runs scripts/fleet-certs.sh for the manifests' namespace and
// returns its files by name.
func fleetCerts(t *testing.T) map[string][]byte {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if out, err := exec.Command("bash", filepath.Join("..", "..", "scripts", "fleet-certs.sh"), "--namespace", ns, dir).CombinedOutput(); err != nil {
		t.Fatalf("fleet-certs.sh: %v\n%s", err, out)
	}
	out := map[string][]byte{}
	for _, name := range []string{"ca.crt", "node.crt", "node.key", "api.crt", "api.key"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out
}
