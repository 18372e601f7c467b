package grpcnode

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

// TestErrorsRoundTrip: every error of the contract that a node returns
// reaches the client, through a real server, as the same Go error: the
// same type and fields, the same sentinel for errors.Is, the same message.
func TestErrorsRoundTrip(t *testing.T) {
	f := &fakeNode{}
	c := dial(t, serve(t, f, ServerConfig{}), ClientConfig{})
	for _, tc := range []struct {
		name string
		err  error
		is   error // errors.Is must hold (nil: none)
	}{
		{"agent not found", &nodeapi.AgentError{Code: nodeapi.CodeNotFound, Message: "no such file /x"}, nil},
		{"agent exists", &nodeapi.AgentError{Code: nodeapi.CodeExists, Message: "/x exists"}, nil},
		{"agent too large", &nodeapi.AgentError{Code: nodeapi.CodeTooLarge, Message: "over 10 bytes"}, nil},
		{"agent no space", &nodeapi.AgentError{Code: nodeapi.CodeNoSpace, Message: "disk full"}, nil},
		{"agent unknown code", &nodeapi.AgentError{Code: "is_directory", Message: "a dir"}, nil},
		{"capacity", &nodeapi.CapacityError{Resource: "pids", Need: 100, Reserved: 900, Budget: 950, Ahead: 2, Waited: 1500 * time.Millisecond},
			nodeapi.ErrInsufficientCapacity},
		{"capacity never", &nodeapi.CapacityError{Resource: "memory", Need: 8 << 30, Budget: 4 << 30, Never: true}, nodeapi.ErrInsufficientCapacity},
		{"stopped", &nodeapi.StoppedError{ID: "sb-1", OOMKills: 3}, nodeapi.ErrSandboxStopped},
		{"template missing", &nodeapi.TemplateMissingError{Digest: "sha256:ab"}, nodeapi.ErrTemplateMissing},
		{"api", &apierr.Error{Code: client.CodeRateLimited, Message: "slow down", RetryAfter: 2}, nil},
	} {
		f.err = tc.err
		_, got := c.Stat(t.Context(), "sb-1", "/x")
		if got == nil || reflect.TypeOf(got) != reflect.TypeOf(tc.err) {
			t.Errorf("%s: got %T %v, want %T", tc.name, got, got, tc.err)
			continue
		}
		if !reflect.DeepEqual(got, tc.err) {
			t.Errorf("%s: got %#v, want %#v", tc.name, got, tc.err)
		}
		if got.Error() != tc.err.Error() {
			t.Errorf("%s: message %q, want %q", tc.name, got.Error(), tc.err.Error())
		}
		if tc.is != nil && !errors.Is(got, tc.is) {
			t.Errorf("%s: %v is not %v", tc.name, got, tc.is)
		}
	}
	// Wrapped errors and sentinels: errors.Is holds and the message stays.
	for _, sentinel := range []error{nodeapi.ErrSandboxNotFound, nodeapi.ErrUnknownRuntime, nodeapi.ErrNodeClosed, nodeapi.ErrTemplateMissing} {
		f.err = fmt.Errorf("node: sandbox sb-2: %w", sentinel)
		_, got := c.Stat(t.Context(), "sb-2", "/x")
		if !errors.Is(got, sentinel) || got.Error() != f.err.Error() {
			t.Errorf("%v: got %v", sentinel, got)
		}
	}
	// A wrapped agent error keeps its type and fields.
	f.err = fmt.Errorf("node: %w", &nodeapi.AgentError{Code: nodeapi.CodePermission, Message: "denied"})
	_, got := c.Stat(t.Context(), "sb-3", "/x")
	if ae := (*nodeapi.AgentError)(nil); !errors.As(got, &ae) || ae.Code != nodeapi.CodePermission || ae.Message != "denied" {
		t.Errorf("wrapped agent error: %v", got)
	}
	// Context errors stay context errors.
	for _, ctxErr := range []error{context.Canceled, context.DeadlineExceeded} {
		f.err = fmt.Errorf("agentproto stat: %w", ctxErr)
		if _, got := c.Stat(t.Context(), "sb-4", "/x"); !errors.Is(got, ctxErr) {
			t.Errorf("%v: got %v", ctxErr, got)
		}
	}
	// Another error keeps its message and no meaning.
	f.err = errors.New("runsc: something broke at /var/lib/x")
	_, got = c.Stat(t.Context(), "sb-5", "/x")
	if got == nil || errors.Is(got, nodeapi.ErrNodeUnreachable) || !strings.Contains(got.Error(), "runsc: something broke") {
		t.Errorf("plain error: %v", got)
	}
}

// TestUnreachableNode: a node that is not there is ErrNodeUnreachable (the
// sandbox's state is not known), not a sandbox error.
func TestUnreachableNode(t *testing.T) {
	c := dial(t, "127.0.0.1:1", ClientConfig{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.Stat(ctx, "sb", "/"); !errors.Is(err, nodeapi.ErrNodeUnreachable) {
		t.Errorf("stat on a closed port: %v", err)
	}
}
