package nodepb

import (
	"os/exec"
	"testing"
)

// TestGeneratedCodeIsFresh fails when this package is not what
// scripts/proto.sh generates from proto/ with the pinned tools. Without
// protoc it skips: scripts/test.sh runs the same check after installing it.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Skip("protoc not installed (scripts/proto.sh installs Debian's protobuf-compiler)")
	}
	out, err := exec.Command("bash", "../../../scripts/proto.sh", "--check").CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/proto.sh --check: %v\n%s", err, out)
	}
}
