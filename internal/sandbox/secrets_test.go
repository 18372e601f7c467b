package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/secrets"
	"github.com/evalbox/evalbox/internal/store"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestValidateSecrets(t *testing.T) {
	many := map[string]string{}
	for i := range MaxSecrets + 1 {
		many[fmt.Sprintf("S%d", i)] = "v"
	}
	for name, tc := range map[string]struct {
		req  client.CreateSandboxRequest
		want string // "" valid; else a part of the message
	}{
		"none":          {},
		"given and ref": {req: client.CreateSandboxRequest{Secrets: map[string]string{"A": "x"}, SecretRefs: []string{"B"}, Env: map[string]string{"C": "y"}}},
		"bad name":      {req: client.CreateSandboxRequest{Secrets: map[string]string{"1A": "x"}}, want: "not valid"},
		"name with =":   {req: client.CreateSandboxRequest{Secrets: map[string]string{"A=B": "x"}}, want: "not valid"},
		"bad ref":       {req: client.CreateSandboxRequest{SecretRefs: []string{"a-b"}}, want: "not valid"},
		"NUL value":     {req: client.CreateSandboxRequest{Secrets: map[string]string{"A": "x\x00y"}}, want: "NUL"},
		"long value":    {req: client.CreateSandboxRequest{Secrets: map[string]string{"A": strings.Repeat("x", MaxSecretBytes+1)}}, want: "over"},
		"in env":        {req: client.CreateSandboxRequest{Secrets: map[string]string{"A": "x"}, Env: map[string]string{"A": "y"}}, want: "both env and secrets"},
		"ref in env":    {req: client.CreateSandboxRequest{SecretRefs: []string{"A"}, Env: map[string]string{"A": "y"}}, want: "both env and secret_refs"},
		"ref given":     {req: client.CreateSandboxRequest{SecretRefs: []string{"A"}, Secrets: map[string]string{"A": "y"}}, want: "both secrets and secret_refs"},
		"ref twice":     {req: client.CreateSandboxRequest{SecretRefs: []string{"A", "A"}}, want: "twice"},
		"too many":      {req: client.CreateSandboxRequest{Secrets: many}, want: "at most"},
	} {
		t.Run(name, func(t *testing.T) {
			err := validateSecrets(tc.req)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Code != client.CodeBadRequest || !strings.Contains(ae.Message, tc.want) {
				t.Fatalf("err = %v, want bad_request with %q", err, tc.want)
			}
			for _, v := range tc.req.Secrets {
				if len(v) > 0 && strings.Contains(ae.Message, v) && v != "x" && v != "y" && v != "v" {
					t.Fatalf("the message holds the value: %q", ae.Message)
				}
			}
		})
	}
}

type fakeResolver map[string]string

func (f fakeResolver) Resolve(_ context.Context, teamID string, names []string) (map[string]string, error) {
	out := map[string]string{}
	for _, n := range names {
		v, ok := f[teamID+"/"+n]
		if !ok {
			return nil, fmt.Errorf("%w: %s", secrets.ErrNotFound, n)
		}
		out[n] = v
	}
	return out, nil
}

func TestResolveSecrets(t *testing.T) {
	ctx := context.Background()
	s := &Service{cfg: Config{Secrets: fakeResolver{"t1/REF": "from-vault"}}}
	req := client.CreateSandboxRequest{Secrets: map[string]string{"GIVEN": "g"}, SecretRefs: []string{"REF"}}
	got, err := s.resolveSecrets(ctx, "t1", req)
	if err != nil || len(got) != 2 || got["GIVEN"] != "g" || got["REF"] != "from-vault" {
		t.Fatalf("resolve = %v, %v", got, err)
	}
	if len(req.Secrets) != 1 {
		t.Fatalf("the request's secrets were changed: %v", req.Secrets)
	}
	// Another team's name is not found.
	var ae *apierr.Error
	if _, err := s.resolveSecrets(ctx, "t2", req); !errors.As(err, &ae) || ae.Code != client.CodeNotFound {
		t.Fatalf("another team's ref = %v, want not_found", err)
	}
	// A server without a vault refuses refs, not plain secrets.
	none := &Service{}
	if _, err := none.resolveSecrets(ctx, "t1", req); !errors.As(err, &ae) || ae.Code != client.CodeNotImplemented {
		t.Fatalf("no vault = %v, want not_implemented", err)
	}
	if got, err := none.resolveSecrets(ctx, "t1", client.CreateSandboxRequest{Secrets: map[string]string{"A": "a"}}); err != nil || got["A"] != "a" {
		t.Fatalf("no vault, plain secrets = %v, %v", got, err)
	}
}

type fakeTariffs struct {
	by    map[string]store.Tariff
	reads int
}

func (f *fakeTariffs) GetTariff(_ context.Context, name string) (store.Tariff, error) {
	f.reads++
	t, ok := f.by[name]
	if !ok {
		return store.Tariff{}, fmt.Errorf("tariff %s: %w", name, store.ErrNotFound)
	}
	return t, nil
}

// TestTariffAbuseLimits: a sandbox's tariff's own CPU-abuse threshold and
// window, each the server's where it has none; no tariff or one without a
// rule: the server's. Tariffs are read once per tariffTTL, unknown ones too.
func TestTariffAbuseLimits(t *testing.T) {
	half, minute, zero := 0.5, time.Minute, time.Duration(0)
	ts := &fakeTariffs{by: map[string]store.Tariff{"strict": {Name: "strict", CPUAbuseThreshold: &half, CPUAbuseWindow: &minute},
		"exempt": {Name: "exempt", CPUAbuseWindow: &zero}, "plain": {Name: "plain"}}}
	s := &Service{cfg: Config{Tariffs: ts, CPUAbuse: CPUAbuseConfig{Threshold: 0.9, Window: 15 * time.Minute}}, tariffCache: map[string]cachedTariff{}}
	for range 2 {
		for tariff, want := range map[string]struct {
			th float64
			w  time.Duration
			ok bool
		}{"strict": {0.5, time.Minute, true}, "exempt": {0.9, 0, true}, "plain": {0, 0, false}, "": {0, 0, false}, "gone": {0, 0, false}} {
			th, w, ok := s.tariffAbuseLimits(client.Sandbox{Tariff: tariff})
			if th != want.th || w != want.w || ok != want.ok {
				t.Errorf("tariff %q: %v %v %v, want %+v", tariff, th, w, ok, want)
			}
		}
	}
	if ts.reads != 4 {
		t.Errorf("%d reads of the store for 4 tariffs asked twice, want 4 (cached)", ts.reads)
	}
}
