package e2e

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// watchRecorder runs one WatchDir in the background and keeps its events.
type watchRecorder struct {
	mu      sync.Mutex
	events  []client.WatchEvent
	started chan struct{}
	done    chan error
	cancel  context.CancelFunc
}

func startWatch(t *testing.T, c *client.Client, id, path string, recursive bool) *watchRecorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watchRecorder{started: make(chan struct{}), done: make(chan error, 1), cancel: cancel}
	t.Cleanup(cancel)
	go func() {
		w.done <- c.WatchDir(ctx, id, path, recursive, func(ev client.WatchEvent) error {
			if ev.Type == client.WatchStart {
				close(w.started)
				return nil
			}
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
			return nil
		})
	}()
	select {
	case <-w.started:
	case err := <-w.done:
		t.Fatalf("watch %s: %v", path, err)
	case <-time.After(time.Minute):
		t.Fatalf("watch %s did not start", path)
	}
	return w
}

// waitFor waits until every one of want was seen, in order.
func (w *watchRecorder) waitFor(t *testing.T, want ...client.WatchEvent) []client.WatchEvent {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		got := slices.Clone(w.events)
		w.mu.Unlock()
		rest := want
		for _, ev := range got {
			if len(rest) > 0 && ev == rest[0] {
				rest = rest[1:]
			}
		}
		if len(rest) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %v; still waiting for %v", got, rest)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchDir follows a directory's changes on both runtimes (inotify in
// the sandbox, through the agent, the node contract and the NDJSON
// stream), its end when the directory goes, bad input, the per-sandbox
// limit, another team, and a watch whose sandbox is deleted.
func TestWatchDir(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 32})
	other := defaultTeam(t)
	ev := func(typ, name string) client.WatchEvent { return client.WatchEvent{Type: typ, Name: name} }
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: rt})
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "mkdir -p /w/old"})
			w := startWatch(t, c, sb.ID, "/w", true)
			res := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "echo x > /w/a.txt && mkdir /w/sub && sleep 0.2 && echo y > /w/sub/b.txt && echo z > /w/old/c.txt" +
				" && chmod 600 /w/a.txt && mv /w/a.txt /w/sub/a2.txt && rm -r /w/old"})
			if res.ExitCode != 0 {
				t.Fatalf("changes: %+v", res)
			}
			w.waitFor(t, ev("create", "a.txt"), ev("write", "a.txt"), ev("create", "sub"), ev("create", "sub/b.txt"), ev("create", "old/c.txt"),
				ev("chmod", "a.txt"), ev("rename", "a.txt"), ev("create", "sub/a2.txt"), ev("remove", "old/c.txt"), ev("remove", "old"))

			// A flat watch beside it sees its own entries only.
			flat := startWatch(t, c, sb.ID, "/w", false)
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "touch /w/sub/deep.txt /w/top.txt"})
			if got := flat.waitFor(t, ev("create", "top.txt")); slices.Contains(got, ev("create", "sub/deep.txt")) {
				t.Errorf("a flat watch saw a subdirectory's file: %v", got)
			}

			// The directory itself goes: both streams end, without an error.
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "rm -r /w"})
			for _, r := range []*watchRecorder{w, flat} {
				select {
				case err := <-r.done:
					if err != nil {
						t.Errorf("the watch's end: %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the watch did not end with its directory")
				}
			}

			// Bad input, and another team.
			mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "mkdir -p /v && touch /v/file"})
			for path, code := range map[string]string{"/v/file": client.CodeBadRequest, "/nope": client.CodeNotFound, "v": client.CodeBadRequest, "": client.CodeBadRequest} {
				err := c.WatchDir(ctxT(t, time.Minute), sb.ID, path, false, func(client.WatchEvent) error { return nil })
				if client.ErrorCode(err) != code {
					t.Errorf("watch %q: %v, want %s", path, err, code)
				}
			}
			if err := other.WatchDir(ctxT(t, time.Minute), sb.ID, "/v", false, func(client.WatchEvent) error { return nil }); !client.IsNotFound(err) {
				t.Errorf("another team's watch: %v", err)
			}

			// At most 16 open at once; a closed one frees its place.
			var open []*watchRecorder
			for range 16 {
				open = append(open, startWatch(t, c, sb.ID, "/v", false))
			}
			err := c.WatchDir(ctxT(t, time.Minute), sb.ID, "/v", false, func(client.WatchEvent) error { return nil })
			if client.ErrorCode(err) != client.CodeRateLimited {
				t.Errorf("the 17th watch: %v", err)
			}
			open[0].cancel()
			<-open[0].done
			deadline := time.Now().Add(30 * time.Second)
			for {
				ctx, cancel := context.WithCancel(context.Background())
				started := make(chan struct{})
				errc := make(chan error, 1)
				go func() {
					errc <- c.WatchDir(ctx, sb.ID, "/v", false, func(client.WatchEvent) error { close(started); return nil })
				}()
				var err error
				select {
				case <-started:
				case err = <-errc:
				}
				cancel()
				if err == nil {
					break
				}
				if client.ErrorCode(err) != client.CodeRateLimited || time.Now().After(deadline) {
					t.Fatalf("a watch after one closed: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}

			// The sandbox is deleted: the open watches end with an error.
			if err := c.DeleteSandbox(ctxT(t, time.Minute), sb.ID); err != nil {
				t.Fatal(err)
			}
			for _, r := range open[1:] {
				select {
				case err := <-r.done:
					if err == nil || errors.Is(err, context.Canceled) {
						t.Errorf("a watch of a deleted sandbox ended with %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("a watch of a deleted sandbox did not end")
				}
			}
		})
	}
	assertNoSandboxes(t, c)
}
