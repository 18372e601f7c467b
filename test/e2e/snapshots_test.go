package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// apiErr returns err's API error (nil if it is none).
func apiErr(err error) *client.APIError {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

// wantCode fails unless err is an API error of status and code.
func wantCode(t *testing.T, what string, err error, status int, code string) {
	t.Helper()
	if ae := apiErr(err); ae == nil || ae.Status != status || ae.Code != code {
		t.Errorf("%s: %v, want %d %s", what, err, status, code)
	}
}

// deleteAtEnd deletes sandboxes at cleanup and checks nothing of them is
// left on the host.
func deleteAtEnd(t *testing.T, c *client.Client, sbs ...client.Sandbox) {
	t.Cleanup(func() {
		for _, sb := range sbs {
			if err := c.DeleteSandbox(context.Background(), sb.ID); err != nil && !client.IsNotFound(err) {
				t.Errorf("delete %s: %v", sb.ID, err)
			}
			assertGone(t, srv, sb.ID)
		}
	})
}

// TestSnapshots: a gVisor sandbox's snapshot restores into sandboxes that
// have its files and processes and are independent of it and of each
// other; forks are all or none; snapshots are the team's only; a deleted
// one leaves its sandboxes running; a damaged one is refused; one past
// the storage limit is not kept; namespaces answers 400.
func TestSnapshots(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 16})
	other := defaultTeam(t)
	ctx := ctxT(t, 5*time.Minute)
	src := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeGVisor, Timeout: 600, Env: map[string]string{"SRC_ONLY": "s3"}})
	mustExec(t, c, src.ID, client.ExecRequest{Cmd: "mkdir -p /work && echo prepared > /work/state"})
	bg, err := c.StartProcess(ctx, src.ID, client.ExecRequest{Cmd: "i=0; while :; do i=$((i+1)); echo $i > /work/count; sleep 0.05; done", Tag: "counter"})
	if err != nil {
		t.Fatal(err)
	}

	sn, err := c.Snapshot(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sn.SandboxID != src.ID || !sn.Memory || sn.SizeBytes <= 0 || sn.Runtime != client.RuntimeGVisor || sn.Template != "base" ||
		sn.TemplateDigest != src.TemplateDigest || sn.CPU != src.CPU || sn.MemoryMB != src.MemoryMB || sn.Network != src.Network {
		t.Fatalf("snapshot %+v of %+v", sn, src)
	}
	t.Cleanup(func() { _ = c.DeleteSnapshot(context.Background(), sn.ID) })
	if got, err := c.GetSnapshot(ctx, sn.ID); err != nil || got.ID != sn.ID || got.SizeBytes != sn.SizeBytes {
		t.Errorf("get snapshot: %+v %v", got, err)
	}
	if l, err := c.ListSnapshots(ctx); err != nil || len(l) != 1 || l[0].ID != sn.ID {
		t.Errorf("list snapshots: %+v %v", l, err)
	}
	// The source goes on.
	mustExec(t, c, src.ID, client.ExecRequest{Cmd: "echo after > /work/state"})

	// Another team sees none of it.
	_, err = other.GetSnapshot(ctx, sn.ID)
	wantCode(t, "another team's get", err, http.StatusNotFound, client.CodeNotFound)
	_, err = other.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: sn.ID})
	wantCode(t, "another team's create", err, http.StatusNotFound, client.CodeNotFound)
	wantCode(t, "another team's delete", other.DeleteSnapshot(ctx, sn.ID), http.StatusNotFound, client.CodeNotFound)
	_, err = other.Snapshot(ctx, src.ID)
	wantCode(t, "another team's snapshot of the sandbox", err, http.StatusNotFound, client.CodeNotFound)
	_, err = other.Fork(ctx, src.ID, client.ForkRequest{Count: 1})
	wantCode(t, "another team's fork", err, http.StatusNotFound, client.CodeNotFound)
	if l, err := other.ListSnapshots(ctx); err != nil || len(l) != 0 {
		t.Errorf("another team's list: %+v %v", l, err)
	}

	// A sandbox restored from it has its files and its running process.
	restored := mustCreate(t, c, client.CreateSandboxRequest{Snapshot: sn.ID, Metadata: map[string]string{"k": "v"}})
	if restored.Snapshot != sn.ID || restored.Template != "base" || restored.Runtime != client.RuntimeGVisor || restored.TrafficToken == "" {
		t.Errorf("restored %+v", restored)
	}
	if got := mustExec(t, c, restored.ID, client.ExecRequest{Cmd: "cat /work/state"}).Stdout; got != "prepared\n" {
		t.Errorf("restored /work/state %q", got)
	}
	if got := mustExec(t, c, restored.ID, client.ExecRequest{Cmd: `echo "$SRC_ONLY"`}).Stdout; got != "s3\n" {
		t.Errorf("restored: the source's env %q", got)
	}
	counts := func(id string) {
		t.Helper()
		a := mustExec(t, c, id, client.ExecRequest{Cmd: "cat /work/count"}).Stdout
		time.Sleep(300 * time.Millisecond)
		if b := mustExec(t, c, id, client.ExecRequest{Cmd: "cat /work/count"}).Stdout; a == b {
			t.Errorf("%s: the background process does not count (%q)", id, a)
		}
	}
	counts(restored.ID)
	if ps, err := c.ListProcesses(ctx, restored.ID); err != nil || !slices.ContainsFunc(ps, func(p client.Process) bool { return p.ID == bg.ID && p.Running }) {
		t.Errorf("restored processes: %+v %v", ps, err)
	}

	// Bad input.
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: sn.ID, Template: "python"})
	wantCode(t, "a snapshot and a template", err, http.StatusBadRequest, client.CodeBadRequest)
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: "snap-aaaaaaaaaaaaaaaa"})
	wantCode(t, "an unknown snapshot", err, http.StatusNotFound, client.CodeNotFound)
	_, err = c.Snapshot(ctx, "sb-nope")
	wantCode(t, "a snapshot of an unknown sandbox", err, http.StatusNotFound, client.CodeNotFound)
	for _, n := range []int{0, -1, client.MaxForkCount + 1} {
		_, err = c.Fork(ctx, src.ID, client.ForkRequest{Count: n})
		wantCode(t, fmt.Sprintf("a fork of %d", n), err, http.StatusBadRequest, client.CodeBadRequest)
	}

	// A fork: independent copies, the snapshot gone after.
	fork, err := c.Fork(ctx, src.ID, client.ForkRequest{Count: 3, Metadata: map[string]string{"fork": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, c, fork.Sandboxes...)
	if len(fork.Sandboxes) != 3 || fork.Snapshot != nil {
		t.Fatalf("fork: %+v", fork)
	}
	random := map[string]bool{}
	for i, f := range fork.Sandboxes {
		if f.Metadata["fork"] != "1" || f.TrafficToken == "" || f.Snapshot == "" {
			t.Errorf("fork %d: %+v", i, f)
		}
		if got := mustExec(t, c, f.ID, client.ExecRequest{Cmd: "cat /work/state"}).Stdout; got != "after\n" {
			t.Errorf("fork %d: /work/state %q", i, got)
		}
		mustExec(t, c, f.ID, client.ExecRequest{Cmd: fmt.Sprintf("echo %d > /work/mine", i)})
		random[mustExec(t, c, f.ID, client.ExecRequest{Cmd: "od -An -tx1 -N16 /dev/urandom"}).Stdout] = true
	}
	if len(random) != 3 {
		t.Errorf("forks read the same bytes from /dev/urandom: %v", random)
	}
	for i, f := range fork.Sandboxes {
		if got := strings.TrimSpace(mustExec(t, c, f.ID, client.ExecRequest{Cmd: "cat /work/mine"}).Stdout); got != strconv.Itoa(i) {
			t.Errorf("fork %d sees /work/mine %q", i, got)
		}
	}
	if got := mustExec(t, c, src.ID, client.ExecRequest{Cmd: "cat /work/mine 2>&1 || true"}).Stdout; !strings.Contains(got, "No such file") {
		t.Errorf("the source sees a fork's file: %q", got)
	}
	// Killing the counter of one fork leaves the others'.
	if err := c.KillProcess(ctx, fork.Sandboxes[0].ID, bg.ID); err != nil {
		t.Fatal(err)
	}
	counts(fork.Sandboxes[1].ID)
	counts(src.ID)
	if l, _ := c.ListSnapshots(ctx); len(l) != 1 {
		t.Errorf("the fork's snapshot was kept: %+v", l)
	}
	// Past the team's limit (8: 5 run) a fork takes nothing.
	_, err = c.Fork(ctx, src.ID, client.ForkRequest{Count: 4})
	wantCode(t, "a fork past the team limit", err, http.StatusTooManyRequests, client.CodeTooManySandboxes)
	if l, _ := c.ListSandboxes(ctx, client.ListOptions{}); len(l) != 5 {
		t.Errorf("a refused fork left sandboxes: %d running", len(l))
	}
	kept, err := c.Fork(ctx, src.ID, client.ForkRequest{Count: 1, KeepSnapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, c, kept.Sandboxes...)
	if kept.Snapshot == nil || kept.Snapshot.SandboxID != src.ID {
		t.Fatalf("kept fork: %+v", kept)
	}
	if err := c.DeleteSnapshot(ctx, kept.Snapshot.ID); err != nil {
		t.Fatal(err)
	}

	// A deleted snapshot leaves its sandboxes running; no more creates.
	if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "a second delete", c.DeleteSnapshot(ctx, sn.ID), http.StatusNotFound, client.CodeNotFound)
	counts(restored.ID)
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: sn.ID})
	wantCode(t, "a create from a deleted snapshot", err, http.StatusNotFound, client.CodeNotFound)
	if _, err := os.Stat(filepath.Join(srv.dataDir, "snapshots", sn.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted snapshot's files: %v", err)
	}

	// A damaged snapshot is refused, and leaves no sandbox.
	dmg, err := c.Snapshot(ctx, restored.ID)
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(srv.dataDir, "snapshots", dmg.ID, "image", "pages.img")
	if err := os.WriteFile(img, []byte("not pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := c.ListSandboxes(ctx, client.ListOptions{All: true})
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: dmg.ID})
	wantCode(t, "a create from a damaged snapshot", err, http.StatusConflict, client.CodeConflict)
	if after, _ := c.ListSandboxes(ctx, client.ListOptions{All: true}); len(after) != len(before) {
		t.Errorf("a refused create left a row: %d, then %d", len(before), len(after))
	}
	if err := c.DeleteSnapshot(ctx, dmg.ID); err != nil {
		t.Fatal(err)
	}

	// A snapshot of a sandbox that ended.
	gone := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeGVisor})
	if err := c.DeleteSandbox(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.Snapshot(ctx, gone.ID)
	wantCode(t, "a snapshot of a deleted sandbox", err, http.StatusConflict, client.CodeSandboxNotRunning)

	if l, _ := c.ListSnapshots(ctx); len(l) != 0 {
		t.Errorf("snapshots left: %+v", l)
	}
	if entries, _ := os.ReadDir(filepath.Join(srv.dataDir, "snapshots")); slices.ContainsFunc(entries, func(e os.DirEntry) bool {
		return strings.HasPrefix(e.Name(), sn.ID) || strings.HasPrefix(e.Name(), dmg.ID) || strings.HasPrefix(e.Name(), kept.Snapshot.ID)
	}) {
		t.Errorf("snapshot files left: %v", entries)
	}
}

// TestSnapshotStorageLimit: a snapshot past the team's storage limit is
// not kept (413), on the node neither.
// TestSnapshotsNamespaces: a namespaces sandbox's snapshot holds its
// files, not its memory; sandboxes made from it boot afresh on them, each
// with a copy of its own.
func TestSnapshotsNamespaces(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 8, MaxConcurrentExec: 16})
	other := defaultTeam(t)
	ctx := ctxT(t, 5*time.Minute)
	src := mustCreate(t, c, client.CreateSandboxRequest{Template: "python", Runtime: client.RuntimeNamespaces, Timeout: 600,
		Env: map[string]string{"SRC_ONLY": "s3", "BOTH": "src"}})
	mustExec(t, c, src.ID, client.ExecRequest{Cmd: "set -e; mkdir -p /work; echo prepared > /work/state; " +
		"useradd -m trial; echo mine > /home/trial/f; chown trial /home/trial/f; chmod 600 /home/trial/f; " +
		"rm -rf /usr/share/doc; ln -s /work/state /work/link"})
	if _, err := c.StartProcess(ctx, src.ID, client.ExecRequest{Cmd: "sleep 600", Tag: "sleeper"}); err != nil {
		t.Fatal(err)
	}
	sn, err := c.Snapshot(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSnapshot(context.Background(), sn.ID) })
	if sn.Memory || sn.Runtime != client.RuntimeNamespaces || sn.Template != "python" || sn.SizeBytes <= 0 || sn.SandboxID != src.ID {
		t.Fatalf("snapshot %+v of %+v", sn, src)
	}
	_, err = other.GetSnapshot(ctx, sn.ID)
	wantCode(t, "another team's get", err, http.StatusNotFound, client.CodeNotFound)
	_, err = other.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: sn.ID})
	wantCode(t, "another team's create", err, http.StatusNotFound, client.CodeNotFound)

	check := "cat /work/state; cat /work/link; su trial -c 'cat /home/trial/f'; stat -c '%U %a' /home/trial/f; " +
		"test ! -e /usr/share/doc && echo doc-gone; python3 -c 'print(6*7)'"
	want := "prepared\nprepared\nmine\ntrial 600\ndoc-gone\n42\n"
	restored := mustCreate(t, c, client.CreateSandboxRequest{Snapshot: sn.ID, Env: map[string]string{"BOTH": "mine"}})
	if restored.Snapshot != sn.ID || restored.Runtime != client.RuntimeNamespaces || restored.Template != "python" {
		t.Errorf("restored %+v", restored)
	}
	// The source's create env comes along, the create's own over it.
	envCheck := client.ExecRequest{Cmd: `echo "$SRC_ONLY $BOTH"`}
	if got := mustExec(t, c, restored.ID, envCheck).Stdout; got != "s3 mine\n" {
		t.Errorf("restored env %q", got)
	}
	if got := mustExec(t, c, restored.ID, client.ExecRequest{Cmd: check}).Stdout; got != want {
		t.Errorf("restored sees %q, want %q", got, want)
	}
	// Files, not processes: it booted afresh.
	if ps, err := c.ListProcesses(ctx, restored.ID); err != nil || len(ps) != 0 {
		t.Errorf("restored processes: %+v %v", ps, err)
	}

	fork, err := c.Fork(ctx, src.ID, client.ForkRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, c, fork.Sandboxes...)
	for i, f := range fork.Sandboxes {
		if got := mustExec(t, c, f.ID, client.ExecRequest{Cmd: check}).Stdout; got != want {
			t.Errorf("fork %d sees %q", i, got)
		}
		if got := mustExec(t, c, f.ID, envCheck).Stdout; got != "s3 src\n" {
			t.Errorf("fork %d env %q", i, got)
		}
		mustExec(t, c, f.ID, client.ExecRequest{Cmd: fmt.Sprintf("echo %d > /work/mine; rm /work/state", i)})
	}
	for i, f := range fork.Sandboxes {
		if got := mustExec(t, c, f.ID, client.ExecRequest{Cmd: "cat /work/mine"}).Stdout; got != fmt.Sprintf("%d\n", i) {
			t.Errorf("fork %d sees /work/mine %q", i, got)
		}
	}
	if got := mustExec(t, c, src.ID, client.ExecRequest{Cmd: "cat /work/state; test -e /work/mine || echo none"}).Stdout; got != "prepared\nnone\n" {
		t.Errorf("the source after the forks: %q", got)
	}
	if got := mustExec(t, c, restored.ID, client.ExecRequest{Cmd: "cat /work/state"}).Stdout; got != "prepared\n" {
		t.Errorf("the restored sandbox after the forks: %q", got)
	}

	// A pause needs memory: 400, never a 5xx.
	_, err = c.Pause(ctx, src.ID)
	wantCode(t, "a pause of a namespaces sandbox", err, http.StatusBadRequest, client.CodeBadRequest)
	// Files larger than the disk (sparse): a conflict, and no snapshot.
	sparse := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeNamespaces, DiskMB: 64})
	mustExec(t, c, sparse.ID, client.ExecRequest{Cmd: "truncate -s 1T /sparse"})
	_, err = c.Snapshot(ctx, sparse.ID)
	wantCode(t, "a snapshot of a 1 TiB sparse file", err, http.StatusConflict, client.CodeConflict)
	// A damaged archive is refused, and leaves no sandbox.
	if err := os.Truncate(filepath.Join(srv.dataDir, "snapshots", sn.ID, "image", "upper.tar"), 512); err != nil {
		t.Fatal(err)
	}
	before, _ := c.ListSandboxes(ctx, client.ListOptions{All: true})
	_, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: sn.ID})
	wantCode(t, "a create from a damaged snapshot", err, http.StatusConflict, client.CodeConflict)
	if after, _ := c.ListSandboxes(ctx, client.ListOptions{All: true}); len(after) != len(before) {
		t.Errorf("a refused create left a row: %d, then %d", len(before), len(after))
	}
	if l, _ := c.ListSnapshots(ctx); len(l) != 1 {
		t.Errorf("snapshots: %+v, want only %s", l, sn.ID)
	}
}

func TestSnapshotStorageLimit(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 2, MaxConcurrentExec: 4, MaxStorageMB: 1})
	ctx := ctxT(t, 2*time.Minute)
	sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeGVisor})
	mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "head -c 2000000 /dev/urandom > /root/big"})
	before, _ := os.ReadDir(filepath.Join(srv.dataDir, "snapshots"))
	_, err := c.Snapshot(ctx, sb.ID)
	wantCode(t, "a snapshot past the storage limit", err, http.StatusRequestEntityTooLarge, client.CodeStorageQuotaExceeded)
	if l, err := c.ListSnapshots(ctx); err != nil || len(l) != 0 {
		t.Errorf("snapshots: %+v %v", l, err)
	}
	if after, _ := os.ReadDir(filepath.Join(srv.dataDir, "snapshots")); len(after) > len(before) {
		t.Errorf("snapshot files left: %v", after)
	}
	// The sandbox goes on.
	mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "true"})
}

// TestPauseResume: a paused sandbox holds no host processes and answers
// calls with 409; resumed, again and again, it keeps every run's changes
// and its processes (E2B's "changes lost after the second resume" and
// "second resume returns 500"); two resumes at once resume it once; a
// paused sandbox expires at its TTL and leaves nothing.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 8})
	ctx := ctxT(t, 5*time.Minute)
	sb := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeGVisor, Timeout: 600})
	bg, err := c.StartProcess(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 3600", Tag: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 3; round++ {
		mustExec(t, c, sb.ID, client.ExecRequest{Cmd: fmt.Sprintf("echo %d >> /root/rounds", round)})
		p, err := c.Pause(ctx, sb.ID)
		if err != nil {
			t.Fatalf("pause %d: %v", round, err)
		}
		if p.State != client.StatePaused || p.PausedAt == nil {
			t.Errorf("pause %d: %+v", round, p)
		}
		if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != client.StatePaused {
			t.Errorf("get while paused: %+v %v", got, err)
		}
		// Nothing of it runs on the host.
		for _, l := range hostLeftovers(srv, sb.ID) {
			if !strings.HasPrefix(l, "file: ") {
				t.Errorf("round %d: a paused sandbox holds %s", round, l)
			}
		}
		_, err = c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "true"})
		wantCode(t, "an exec while paused", err, http.StatusConflict, client.CodeSandboxNotRunning)
		_, err = c.Pause(ctx, sb.ID)
		wantCode(t, "a second pause", err, http.StatusConflict, client.CodeConflict)
		_, err = c.Snapshot(ctx, sb.ID)
		wantCode(t, "a snapshot while paused", err, http.StatusConflict, client.CodeSandboxNotRunning)

		// Two resumes at once: one resumes, the other is a conflict.
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { _, errs[i] = c.Resume(ctx, sb.ID, client.ResumeRequest{}) })
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
			} else {
				wantCode(t, "the other of two resumes", err, http.StatusConflict, client.CodeConflict)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d resumes succeeded: %v", round, ok, errs)
		}
		want := ""
		for i := 1; i <= round; i++ {
			want += fmt.Sprintf("%d\n", i)
		}
		if got := mustExec(t, c, sb.ID, client.ExecRequest{Cmd: "cat /root/rounds"}).Stdout; got != want {
			t.Fatalf("after resume %d: /root/rounds %q, want %q", round, got, want)
		}
		if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != client.StateRunning || got.PausedAt != nil {
			t.Errorf("get after resume %d: %+v %v", round, got, err)
		}
	}
	if ps, err := c.ListProcesses(ctx, sb.ID); err != nil || !slices.ContainsFunc(ps, func(p client.Process) bool { return p.ID == bg.ID && p.Running }) {
		t.Errorf("processes after the resumes: %+v %v", ps, err)
	}
	_, err = c.Resume(ctx, sb.ID, client.ResumeRequest{})
	wantCode(t, "a resume of a running sandbox", err, http.StatusConflict, client.CodeConflict)

	// A paused sandbox keeps its TTL.
	short := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeGVisor, Timeout: 3})
	if _, err := c.Pause(ctx, short.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := c.GetSandbox(ctx, short.ID)
		if err == nil && got.State == client.StateExpired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a paused sandbox past its TTL: %+v %v", got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	assertGone(t, srv, short.ID)
}

// TestSnapshotCLI drives snapshots, forks, pause and resume through the
// evalbox CLI; bad input exits non-zero with one readable line.
func TestSnapshotCLI(t *testing.T) {
	t.Parallel()
	c, _, key := newTeam(t, srv, client.Limits{MaxSandboxes: 6, MaxConcurrentExec: 8})
	run := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := cliAs(t, key, args...)
		if code != 0 {
			t.Fatalf("evalbox %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
		return strings.TrimSpace(stdout)
	}
	src := mustCreate(t, c, client.CreateSandboxRequest{Runtime: client.RuntimeGVisor})
	mustExec(t, c, src.ID, client.ExecRequest{Cmd: "echo cli > /root/f"})
	snap := run("sandbox", "snapshot", src.ID)
	if !strings.HasPrefix(snap, "snap-") {
		t.Fatalf("snapshot id %q", snap)
	}
	id := run("sandbox", "create", "--snapshot", snap, "--metadata", "via=cli")
	sb, err := c.GetSandbox(context.Background(), id)
	if err != nil || sb.Snapshot != snap || sb.Metadata["via"] != "cli" {
		t.Fatalf("created from the snapshot: %+v %v", sb, err)
	}
	deleteAtEnd(t, c, *sb)
	if got := mustExec(t, c, id, client.ExecRequest{Cmd: "cat /root/f"}).Stdout; got != "cli\n" {
		t.Errorf("restored /root/f %q", got)
	}
	forks := strings.Fields(run("sandbox", "fork", src.ID, "-n", "2"))
	if len(forks) != 2 {
		t.Fatalf("fork printed %q", forks)
	}
	for _, f := range forks {
		deleteAtEnd(t, c, client.Sandbox{ID: f})
	}
	if ls := run("snapshot", "ls"); !strings.Contains(ls, snap) || strings.Count(ls, "snap-") != 1 {
		t.Errorf("snapshot ls:\n%s", ls)
	}
	if got := run("sandbox", "pause", src.ID); got != src.ID+" paused" {
		t.Errorf("pause printed %q", got)
	}
	if got := run("sandbox", "resume", src.ID); got != src.ID+" running" {
		t.Errorf("resume printed %q", got)
	}
	run("snapshot", "rm", snap)
	for _, bad := range [][]string{
		{"sandbox", "fork", src.ID, "-n", "0"},
		{"sandbox", "resume", src.ID},
		{"snapshot", "rm", snap},
		{"sandbox", "snapshot"},
	} {
		_, stderr, code := cliAs(t, key, bad...)
		if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || stderr == "" {
			t.Errorf("evalbox %s: exit %d, stderr %q (want non-zero and one line)", strings.Join(bad, " "), code, stderr)
		}
	}
}
