package membership

import (
	"context"
	"path/filepath"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/evalbox/evalbox/internal/kubetest"
)

// TestRBAC applies deploy/kubernetes/rbac.yaml, the RBAC the manifests ship,
// and acts as its ServiceAccounts with tokens the apiserver issues them: the
// node agent can hold its Lease and the API can watch it, and neither can do
// more — no Secrets, nothing in another namespace, no Lease writes for the
// API.
func TestRBAC(t *testing.T) {
	env := kubetest.Start(t)
	admin := clientset(t, env.Config)
	ctx := context.Background()
	for _, ns := range []string{"evalbox", "elsewhere"} {
		namespace(t, admin, ns)
	}
	env.ApplyFile(t, filepath.Join("..", "..", "..", "deploy", "kubernetes", "rbac.yaml"), kubetest.ApplyOptions{})

	// What the least-privileged must not reach.
	if _, err := admin.CoreV1().Secrets("evalbox").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "database"}, StringData: map[string]string{"url": "postgres://x"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	holder, secs, now := "other", int32(60), metav1.NowMicro()
	if _, err := admin.CoordinationV1().Leases("elsewhere").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	node := clientset(t, serviceAccount(t, env, admin, "evalbox", "evalbox-node"))
	api := clientset(t, serviceAccount(t, env, admin, "evalbox", "evalbox-api"))

	// Allowed: the node holds its Lease, the API watches it, the node
	// leaves.
	evs := startWatcher(t, api.CoordinationV1().Leases("evalbox"))
	hb := startHeartbeat(t, node.CoordinationV1().Leases("evalbox"), HeartbeatConfig{NodeID: "node-rbac", LeaseDuration: testLease}, testCapacity(0))
	if e := evs.next(t, func(e Event) bool { return true }); e.Type != NodeAdded || e.Node.ID != "node-rbac" {
		t.Fatalf("event %+v, want node-rbac added", e)
	}

	// Refused.
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want forbidden", what, err)
		}
	}
	for name, cs := range map[string]*kubernetes.Clientset{"node": node, "api": api} {
		_, err := cs.CoreV1().Secrets("evalbox").Get(ctx, "database", metav1.GetOptions{})
		forbidden(name+" gets a Secret", err)
		_, err = cs.CoreV1().Secrets("evalbox").List(ctx, metav1.ListOptions{})
		forbidden(name+" lists Secrets", err)
		_, err = cs.CoreV1().Secrets("elsewhere").List(ctx, metav1.ListOptions{})
		forbidden(name+" lists another namespace's Secrets", err)
		_, err = cs.CoordinationV1().Leases("elsewhere").Get(ctx, "other", metav1.GetOptions{})
		forbidden(name+" gets another namespace's Lease", err)
		_, err = cs.CoordinationV1().Leases("elsewhere").List(ctx, metav1.ListOptions{})
		forbidden(name+" lists another namespace's Leases", err)
		_, err = cs.CoordinationV1().Leases("elsewhere").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		forbidden(name+" creates a Lease in another namespace", err)
		_, err = cs.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{})
		forbidden(name+" lists the cluster's Leases", err)
		_, err = cs.CoreV1().Pods("evalbox").List(ctx, metav1.ListOptions{})
		forbidden(name+" lists Pods", err)
		_, err = cs.RbacV1().Roles("evalbox").List(ctx, metav1.ListOptions{})
		forbidden(name+" lists Roles", err)
	}
	// The API cannot forge, change or remove a node's membership.
	_, err := api.CoordinationV1().Leases("evalbox").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "forged"}}, metav1.CreateOptions{})
	forbidden("api creates a Lease", err)
	err = api.CoordinationV1().Leases("evalbox").Delete(ctx, "node-rbac", metav1.DeleteOptions{})
	forbidden("api deletes a node's Lease", err)

	if err := hb.stop(); err != nil {
		t.Fatalf("the node's clean stop: %v", err)
	}
	if e := evs.next(t, func(e Event) bool { return e.Type != NodeUpdated }); e.Type != NodeLeft {
		t.Fatalf("event %+v, want node-rbac left", e)
	}
}

// serviceAccount returns a client config that authenticates as ServiceAccount
// ns/name, by a token the apiserver issues it (TokenRequest), trusting the
// Env's CA and nothing of the admin's.
func serviceAccount(t *testing.T, env *kubetest.Env, admin kubernetes.Interface, ns, name string) *rest.Config {
	t.Helper()
	ttl := int64(3600)
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for %s/%s: %v", ns, name, err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tok.Status.Token
	return cfg
}
