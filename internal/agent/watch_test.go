package agent_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/agent"
	"github.com/evalbox/evalbox/internal/agentproto"
)

// nextEvents reads events until want are all seen (in order, others
// between them allowed) or a timeout.
func nextEvents(t *testing.T, w *agentproto.Watcher, want ...agentproto.WatchEvent) []agentproto.WatchEvent {
	t.Helper()
	type res struct {
		ev  agentproto.WatchEvent
		err error
	}
	ch := make(chan res, 1)
	var got []agentproto.WatchEvent
	for len(want) > 0 {
		go func() { ev, err := w.Next(); ch <- res{ev, err} }()
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("after %v: %v (still wanted %v)", got, r.err, want)
			}
			got = append(got, r.ev)
			if r.ev == want[0] {
				want = want[1:]
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("got %v; still want %v", got, want)
		}
	}
	return got
}

func TestWatch(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "old", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	ev := func(typ, name string) agentproto.WatchEvent { return agentproto.WatchEvent{Type: typ, Name: name} }

	w, err := ta.c.Watch(ctx, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "a.txt"), []byte("x"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "old", "deep", "b.txt"), []byte("x"), 0o644)) // a directory there before
	must(os.Mkdir(filepath.Join(dir, "new"), 0o755))
	// A directory made after the watch began is watched too (a moment
	// later: its creation's event adds it).
	nextEvents(t, w, ev("create", "a.txt"), ev("write", "a.txt"), ev("create", "old/deep/b.txt"), ev("create", "new"))
	must(os.WriteFile(filepath.Join(dir, "new", "c.txt"), nil, 0o644))
	must(os.Chmod(filepath.Join(dir, "a.txt"), 0o600))
	must(os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "new", "a2.txt")))
	must(os.RemoveAll(filepath.Join(dir, "old")))
	got := nextEvents(t, w, ev("create", "new/c.txt"), ev("chmod", "a.txt"), ev("rename", "a.txt"), ev("create", "new/a2.txt"),
		ev("remove", "old/deep/b.txt"), ev("remove", "old/deep"), ev("remove", "old"))
	if n := len(slices.DeleteFunc(slices.Clone(got), func(e agentproto.WatchEvent) bool { return e != ev("remove", "old") })); n != 1 {
		t.Errorf("%d removes of old: %v", n, got)
	}

	// The watched directory itself goes: its event, then the end.
	must(os.RemoveAll(dir))
	for {
		e, err := w.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after the directory went: %v", err)
		}
		t.Logf("event %v", e)
	}

	// A non-recursive watch sees its directory's entries only.
	dir = t.TempDir()
	must(os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	flat, err := ta.c.Watch(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	must(os.WriteFile(filepath.Join(dir, "sub", "hidden.txt"), nil, 0o644))
	must(os.WriteFile(filepath.Join(dir, "seen.txt"), nil, 0o644))
	if got := nextEvents(t, flat, ev("create", "seen.txt")); slices.Contains(got, ev("create", "sub/hidden.txt")) {
		t.Errorf("a non-recursive watch saw a subdirectory: %v", got)
	}
	flat.Close()

	// Bad input.
	for p, code := range map[string]string{"relative": agentproto.CodeBadRequest, filepath.Join(dir, "seen.txt"): agentproto.CodeNotDir,
		filepath.Join(dir, "nope"): agentproto.CodeNotFound} {
		if _, err := ta.c.Watch(ctx, p, false); agentErrCode(err) != code {
			t.Errorf("watch %s: %v, want %s", p, err, code)
		}
	}
}
