package api

import (
	"testing"

	"github.com/evalbox/evalbox/internal/limits"
)

// TestLimitsTable holds the API's bounds equal to internal/limits' table
// (docs/limits.md).
func TestLimitsTable(t *testing.T) {
	for _, x := range []struct {
		name      string
		got, want any
	}{
		{"max_json_body", maxJSONBody, limits.MaxJSONBody},
		{"max_eval_body", maxEvalBody, limits.MaxEvalBody},
		{"execute_default_timeout", defExecuteTimeout, limits.ExecuteDefaultTimeout.Seconds()},
		{"execute_max_timeout", maxExecuteTimeout, limits.ExecuteMaxTimeout.Seconds()},
		{"execute_max_scripts", maxExecuteScripts, limits.ExecuteMaxScripts},
	} {
		if x.got != x.want {
			t.Errorf("%s: the API's %v, internal/limits' %v", x.name, x.got, x.want)
		}
	}
}
