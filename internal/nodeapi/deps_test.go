package nodeapi_test

import (
	"os/exec"
	"strings"
	"testing"
)

// nodeSide are the packages of the node's side of the contract: the node,
// its runtime drivers and the guest agent's protocol.
var nodeSide = []string{
	"github.com/evalbox/evalbox/internal/node",
	"github.com/evalbox/evalbox/internal/agentproto",
	"github.com/evalbox/evalbox/internal/agent",
	"github.com/evalbox/evalbox/internal/runtime",
}

// TestControlPlaneUsesOnlyTheContract holds the node boundary: the control
// plane's packages reach a node only through this package, so that a
// remote node serves them as the in-process one does; the contract and its
// gRPC transport import nothing of the node either.
func TestControlPlaneUsesOnlyTheContract(t *testing.T) {
	for _, pkg := range []string{
		"../sandbox", "../api", "../catalog", "../trial", "../evalrun", "../auth", "../quota", "../store",
		".", "./grpcnode", "./nodepb",
	} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, bad := range nodeSide {
				if dep == bad || strings.HasPrefix(dep, bad+"/") {
					t.Errorf("%s depends on %s: the control plane may use only internal/nodeapi", pkg, dep)
				}
			}
		}
	}
}

// TestContractImportsNothingOfEvalbox keeps nodeapi a leaf.
func TestContractImportsNothingOfEvalbox(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.Contains(imp, ".") {
			t.Errorf("nodeapi imports %s", imp)
		}
	}
}
