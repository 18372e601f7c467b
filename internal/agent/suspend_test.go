package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/internal/agent"
	"github.com/evalbox/evalbox/internal/agentproto"
)

// relayConn is the agent's end of a connection whose host end can be
// swapped, as a restore from a checkpoint gives the agent new stdin and
// stdout: reads and writes go to the current host pipes.
type relayConn struct {
	mu  sync.Mutex
	cur pipeConn
	gen int
}

// TestSuspendResume: a suspended session ends its foreground exec and
// keeps the background processes; calls made while it is suspended wait
// for the resume; sessions resume on the same connection, again and
// again, and on a new one (a restored sandbox's).
func TestSuspendResume(t *testing.T) {
	ta := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	bg, err := ta.c.Start(ctx, agentproto.ExecRequest{Shell: "i=0; while :; do i=$((i+1)); echo $i > count; sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	fg := make(chan error, 1)
	go func() {
		_, err := ta.c.Exec(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "60"}}, nil, nil, nil)
		fg <- err
	}()
	time.Sleep(200 * time.Millisecond)

	nonce := bytes.Repeat([]byte{1}, agentproto.NonceSize)
	if err := ta.c.Suspend(ctx, []byte("short")); err == nil {
		t.Fatal("a short nonce was taken")
	}
	if err := ta.c.Suspend(ctx, nonce); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-fg:
		if !errors.Is(err, agentproto.ErrSuspended) {
			t.Fatalf("foreground exec across a suspend: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the foreground exec did not end with its session")
	}
	select {
	case <-ta.c.Done():
		t.Fatal("Done closed by a suspend")
	default:
	}
	// A call now waits for the resume.
	pinged := make(chan error, 1)
	go func() { pinged <- ta.c.Ping(ctx) }()
	select {
	case err := <-pinged:
		t.Fatalf("ping while suspended answered: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := ta.c.Resume(nil); err != nil {
		t.Fatal(err)
	}
	if err := <-pinged; err != nil {
		t.Fatal(err)
	}
	// Again, twice, then the background process still runs and counts.
	for i := range 3 {
		nonce[0] = byte(10 + i)
		if err := ta.c.Suspend(ctx, nonce); err != nil {
			t.Fatalf("suspend %d: %v", i, err)
		}
		if err := ta.c.Resume(nil); err != nil {
			t.Fatalf("resume %d: %v", i, err)
		}
	}
	if err := ta.c.Resume(nil); err == nil {
		t.Fatal("resume without a suspend")
	}
	procs, err := ta.c.List(ctx)
	if err != nil || len(procs) != 1 || procs[0].ID != bg.ID || !procs[0].Running {
		t.Fatalf("list after resumes: %+v %v", procs, err)
	}
	count := func() string {
		exit, out, _ := ta.exec(t, agentproto.ExecRequest{Shell: "cat count"})
		if exit.ExitCode != 0 {
			t.Fatalf("cat count: %+v", exit)
		}
		return out
	}
	a := count()
	time.Sleep(200 * time.Millisecond)
	if b := count(); a == b {
		t.Fatalf("background process stopped counting (%q)", a)
	}
}

// TestSuspendResumeNewConnection: after a suspend the session resumes
// over a new connection to the same agent, as a sandbox restored from a
// checkpoint does; the old one is not read again.
func TestSuspendResumeNewConnection(t *testing.T) {
	host1, guest1 := pipePair(t)
	r := &relayConn{cur: guest1}
	ctx := ctxT(t)
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- agent.Serve(sctx, r, agent.Config{Workdir: t.TempDir()}) }()
	c, err := agentproto.Dial(host1)
	if err != nil {
		t.Fatal(err)
	}
	bg, err := c.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	nonce := bytes.Repeat([]byte{9}, agentproto.NonceSize)
	if err := c.Suspend(ctx, nonce); err != nil {
		t.Fatal(err)
	}
	host2, guest2 := pipePair(t)
	r.swap(guest2)
	if err := c.Resume(host2); err != nil {
		t.Fatal(err)
	}
	procs, err := c.List(ctx)
	if err != nil || len(procs) != 1 || procs[0].ID != bg.ID || !procs[0].Running {
		t.Fatalf("list over the new connection: %+v %v", procs, err)
	}
	// A second client of the same checkpoint (a fork) would Redial with
	// the nonce; here the agent is one, so only the resumed one talks.
	if err := c.Signal(ctx, bg.ID, 9); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the new connection closed")
	}
}

func (r *relayConn) swap(to pipeConn) {
	r.mu.Lock()
	old := r.cur
	r.cur = to
	r.gen++
	r.mu.Unlock()
	// The old host end is gone: a read waiting on it ends (and is retried
	// on the new one).
	old.w.Close()
	old.r.Close()
}

func (r *relayConn) Read(p []byte) (int, error) {
	for {
		r.mu.Lock()
		cur, gen := r.cur, r.gen
		r.mu.Unlock()
		n, err := cur.r.Read(p)
		r.mu.Lock()
		swapped := r.gen != gen
		r.mu.Unlock()
		if swapped && n == 0 {
			continue
		}
		if err == io.EOF && swapped {
			err = nil
		}
		return n, err
	}
}

func (r *relayConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	return cur.w.Write(p)
}

func (r *relayConn) Close() error {
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	return cur.Close()
}
