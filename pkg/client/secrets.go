package client

import (
	"context"
	"net/http"
)

// PutSecret stores the team's secret name (PUT /v1/secrets/{name}),
// replacing the value of one of that name. Sandboxes get it by name
// (CreateSandboxRequest.SecretRefs); its value can never be read back.
func (c *Client) PutSecret(ctx context.Context, name, value string) (TeamSecret, error) {
	var out TeamSecret
	if err := checkIDs(name); err != nil {
		return out, err
	}
	err := c.do(ctx, &request{method: http.MethodPut, path: "/secrets/" + seg(name), in: PutSecretRequest{Value: value}, retry: true}, &out)
	return out, err
}

// ListSecrets lists the team's stored secrets: names and times only.
func (c *Client) ListSecrets(ctx context.Context) ([]TeamSecret, error) {
	var l TeamSecretList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/secrets", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Secrets, nil
}

// DeleteSecret removes the team's stored secret name. Sandboxes that have
// it keep it until they end.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	if err := checkIDs(name); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/secrets/" + seg(name), retry: true}, nil)
}
