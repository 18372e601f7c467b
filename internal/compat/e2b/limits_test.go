package e2b

import (
	"testing"

	"github.com/evalbox/evalbox/internal/limits"
)

// TestLimitsTable holds the control plane's body bound equal to
// internal/limits' table (docs/limits.md).
func TestLimitsTable(t *testing.T) {
	if maxJSONBody != limits.E2BMaxJSONBody {
		t.Errorf("e2b_max_json_body: E2B's %d, internal/limits' %d", maxJSONBody, limits.E2BMaxJSONBody)
	}
}
