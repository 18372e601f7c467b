package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// plantBody is a correct solution that first plants, everywhere a sample
// may write, modules that make the next program exit with its own pass
// code (the program imports typing; a site hook runs in every Python), a
// file, a directory, a FIFO and a System V IPC object a later sample
// could see, and a daemon that outlives it and keeps planting.
const plantBody = `    import os, sys, ctypes, subprocess
    payload = (
        "import os, sys\n"
        "try:\n"
        "    src = open(os.path.abspath(sys.argv[0])).read()\n"
        "    os._exit(int(src.rsplit('_evalbox_sys.exit(', 1)[1].split(')')[0]))\n"
        "except Exception:\n"
        "    pass\n")
    places = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.getcwd(), os.path.expanduser("~")]
    for d in places:
        for name in ("typing.py", "sitecustomize.py", "usercustomize.py", "planted-file"):
            try:
                open(os.path.join(d, name), "w").write(payload)
            except OSError:
                pass
        try:
            os.makedirs(os.path.join(d, "planted-dir", "deep"))
            os.mkfifo(os.path.join(d, "planted-fifo"))
        except OSError:
            pass
    libc = ctypes.CDLL(None)
    libc.shmget(0x5eed, 4096, 0o1666)
    libc.msgget(0x5eee, 0o1666)
    subprocess.Popen(["sh", "-c", "while :; do for d in /tmp /var/tmp /dev/shm; do cp -f " + os.path.join("/tmp", "typing.py") + " $d/typing.py 2>/dev/null; done; sleep 0.01; done"], start_new_session=True)
    return a + b
`

// killerBody is a correct solution that leaves a daemon whose main thread
// exits (/proc then shows the process as a zombie while its other thread
// runs): the thread kills every later program of the slice.
const killerBody = `    import os, threading, time, ctypes, signal
    if getattr(add, "armed", False):  # check calls add twice: one daemon
        return a + b
    add.armed = True
    r, w = os.pipe()
    sample = os.getpid()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            me = os.getpid()
            def work():
                while True:
                    for p in os.listdir("/proc"):
                        try:
                            if p.isdigit() and int(p) not in (me, sample) and b"program.py" in open("/proc/%s/cmdline" % p, "rb").read():
                                os.kill(int(p), signal.SIGKILL)
                        except (OSError, ValueError):
                            pass
                    time.sleep(0.002)
            threading.Thread(target=work, daemon=False).start()
            os.write(w, str(me).encode())
            ctypes.CDLL(None).syscall(60, 0)
        os._exit(0)
    pid = int(os.read(r, 32))
    while "State:\tZ" not in open("/proc/%d/status" % pid).read():
        time.sleep(0.005)
    return a + b
`

// victimBody is a correct solution that fails when it finds anything an
// earlier sample left: in a fresh sandbox (trial mode) it passes.
const victimBody = `    import os, ctypes
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(d):
            left = [n for n in os.listdir(d) if "planted" in n or n in ("typing.py", "sitecustomize.py", "usercustomize.py")]
            if left:
                raise RuntimeError("left in %s: %s" % (d, left))
    mine = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and os.stat("/proc/" + p).st_uid == os.getuid()]
    for p in mine:
        st = open("/proc/%s/stat" % p).read()
        if st[st.rindex(")") + 2] != "Z":
            raise RuntimeError("process left: " + st)
    libc = ctypes.CDLL(None)
    if libc.shmget(0x5eed, 0, 0) >= 0 or libc.msgget(0x5eee, 0) >= 0:
        raise RuntimeError("System V IPC object left")
    return a + b
`

// TestEvalBatchPlanting: in batch mode the samples of a slice share one
// sandbox, yet a hostile sample changes no other sample's verdict. One
// sample plants modules (typing.py, sitecustomize.py, … in every
// directory a sample may write), files, directories, FIFOs, System V IPC
// objects and a daemon that keeps planting, another leaves a daemon that
// kills every later program and hides as a zombie; the wrong samples after
// them stay failed (before: the planted typing.py read each next program's pass
// code and exited with it: 4 of 9 wrong samples passed), and the correct
// victims after it, which fail if anything was left, stay passed. The
// verdicts equal trial mode's sample by sample, on both runtimes.
func TestEvalBatchPlanting(t *testing.T) {
	t.Parallel()
	prob := client.EvalProblem{TaskID: "p/0", Prompt: "from typing import List\n\n\ndef add(a: int, b: int) -> int:\n", EntryPoint: "add",
		Test: "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(5, 7) == 12\n"}
	wrong := "    return a - b\n"
	var bodies []string
	for i := 0; i < 10; i++ {
		switch {
		case i == 0 || i == 5:
			bodies = append(bodies, plantBody)
		case i == 2:
			bodies = append(bodies, killerBody)
		case i%3 == 0:
			bodies = append(bodies, victimBody)
		default:
			bodies = append(bodies, wrong)
		}
	}
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			c, _, _ := newTeam(t, srv, client.Limits{MaxSandboxes: 4, MaxConcurrentExec: 4})
			req := client.CreateEvalRequest{Problems: []client.EvalProblem{prob}, Runtime: rt, Template: "python", Concurrency: 1, Timeout: 10}
			for _, b := range bodies {
				req.Samples = append(req.Samples, client.EvalSample{TaskID: "p/0", Completion: &b})
			}
			batch := req
			batch.Mode = client.EvalModeBatch
			run, rs := runEvalWait(t, c, batch, 5*time.Minute)
			trun, trs := runEvalWait(t, c, req, 5*time.Minute)
			sameVerdicts(t, "batch vs trial", rs, trs)
			for i, r := range rs {
				want := "failed"
				if bodies[i] != wrong {
					want = "passed"
				}
				if r.Status != want {
					t.Errorf("sample %d (%s): %s %s", i, map[bool]string{true: "wrong", false: "correct"}[bodies[i] == wrong], r.Status, r.Detail)
				}
			}
			if got := fmt.Sprintf("%.1f", run.Summary.PassAtK["pass@1"]); got != fmt.Sprintf("%.1f", trun.Summary.PassAtK["pass@1"]) {
				t.Errorf("pass@1 batch %s, trial %.1f", got, trun.Summary.PassAtK["pass@1"])
			}
			sbs := runSandboxes(t, c, run.ID)
			t.Logf("%s: batch mode used %d sandboxes for %d samples: %s", rt, len(sbs), len(bodies), strings.Join(statuses(rs), "; "))
			runSandboxes(t, c, trun.ID)
		})
	}
}
