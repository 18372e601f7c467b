package sandboxfusion

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/internal/limits"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestLimitsTable holds the bounds of a request equal to internal/limits'
// table (docs/limits.md).
func TestLimitsTable(t *testing.T) {
	for _, x := range []struct {
		name      string
		got, want any
	}{
		{"fusion_max_body", maxBody, limits.FusionMaxBody},
		{"fusion_max_output_bytes", maxOutputBytes, limits.FusionMaxOutputBytes},
		{"execute_default_timeout", defaultTimeout, limits.ExecuteDefaultTimeout.Seconds()},
		{"execute_max_timeout", maxTimeout, limits.ExecuteMaxTimeout.Seconds()},
	} {
		if x.got != x.want {
			t.Errorf("%s: SandboxFusion's %v, internal/limits' %v", x.name, x.got, x.want)
		}
	}
}

// rateLimitedKeys refuses every key as over its team's request rate.
type rateLimitedKeys struct{}

func (rateLimitedKeys) Authenticate(context.Context, string) (auth.Principal, error) {
	return auth.Principal{}, &apierr.Error{Code: client.CodeRateLimited, RetryAfter: 7, Message: "team a is over its 60 requests per minute"}
}

// TestRunCodeRateLimited: a request over its team's rate gets 429 with
// Retry-After, and runs nothing.
func TestRunCodeRateLimited(t *testing.T) {
	f := &fakeTrials{}
	rec, body := serveWith(t, Config{Trials: f, Auth: rateLimitedKeys{}}, false, "10.0.0.1:1", `{"code":"print(1)","language":"python"}`, bearer)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "7" || !strings.Contains(fmt.Sprint(body["detail"]), "60 requests per minute") {
		t.Fatalf("%d %v %v", rec.Code, rec.Header(), body)
	}
	if f.team != "" {
		t.Fatalf("ran a trial for %s", f.team)
	}
}
