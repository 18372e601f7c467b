package judge

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/eval"
	"github.com/evalbox/evalbox/internal/lang"
	"github.com/evalbox/evalbox/pkg/client"
)

// checkerBox is a checker program's sandbox: one per attempt, made at the
// first output it judges, never the sample's. The checker is compiled
// once; for each test the input, the program's output and the expected
// answer are written beside it and it runs as testlib's checkers do:
// "checker input output answer", exit 0 accepts, 1 (wrong answer) or 2
// (presentation error) rejects with its message on stderr, anything else
// (testlib's 3 is "fail") is the checker's failure.
type checkerBox struct {
	// box is the live sandbox; boxes every one made (an output that took
	// one past its memory gets the checker another).
	box   string
	boxes []string
	l     lang.Language
	file  string
	class string
}

func (c *checkerBox) ids() []string {
	if c == nil {
		return nil
	}
	return c.boxes
}

// start makes the checker's sandbox and compiles the checker.
func (c *checkerBox) start(ctx context.Context, a *attempt1) error {
	name := a.spec.Checker.Language
	if name == "" {
		name = "python"
	}
	l, err := lang.Resolve(name)
	if err != nil {
		return fmt.Errorf("%w: %w", errChecker, err)
	}
	c.l = l
	c.file, c.class = l.SourceFile(a.spec.Checker.Source)
	sb, err := a.j.sb.Create(ctx, a.teamID, client.CreateSandboxRequest{
		Template: l.Template, Runtime: a.spec.Runtime, Metadata: a.spec.Metadata,
		MemoryMB: max(checkerMemoryMB, DefaultCompileMemoryMB) + sandboxSlackMB,
		Timeout:  a.ttl(), WaitSeconds: int(a.j.CreateWait.Seconds()),
	})
	if err != nil {
		return fmt.Errorf("create the checker's sandbox: %w", err)
	}
	c.box, c.boxes = sb.ID, append(c.boxes, sb.ID)
	if _, err := a.j.sb.WriteFile(ctx, a.teamID, c.box, Dir+"/"+c.file, "0644", strings.NewReader(a.spec.Checker.Source)); err != nil {
		return fmt.Errorf("write the checker: %w", err)
	}
	if _, err := root(ctx, a.j.sb, a.teamID, c.box, "mkdir -p "+Dir+"/t && chown "+User+" "+Dir+"/t"); err != nil {
		return err
	}
	if !l.Compiled() {
		return nil
	}
	cr, err := compile(ctx, a.j.sb, a.teamID, c.box, l, c.file, Limits{CompileTimeout: DefaultCompileTimeout, CompileMemoryMB: DefaultCompileMemoryMB})
	if err != nil {
		return err
	}
	if !cr.OK {
		return fmt.Errorf("%w: it does not compile: %s", errChecker, compileDetail(cr.Output))
	}
	return nil
}

// check runs the checker on one test's output. A checker that fails on
// it (a crash, a timeout, an exit code testlib does not give a verdict
// with) is run again with the expected answer as the output: if it accepts
// that, the output made it fail, a wrong answer; if not, the checker is
// broken (errChecker, the problem's fault).
func (c *checkerBox) check(ctx context.Context, a *attempt1, tc eval.Test, got []byte) (status, detail string, err error) {
	if c.box == "" {
		if err := c.start(ctx, a); err != nil {
			return "", "", err
		}
	}
	status, detail, err = c.run(ctx, a, tc.Input, string(got), tc.Output)
	if !errors.Is(err, errChecker) {
		return status, detail, err
	}
	if c.box == "" {
		if err := c.start(ctx, a); err != nil {
			return "", "", err
		}
	}
	if st, _, perr := c.run(ctx, a, tc.Input, tc.Output, tc.Output); perr == nil && st == client.TestPassed {
		return client.TestWrongAnswer, "the checker failed on this output (it accepts the answer): " + strings.TrimPrefix(err.Error(), errChecker.Error()+": "), nil
	}
	return "", "", err
}

// run runs the checker once on input, output and answer.
func (c *checkerBox) run(ctx context.Context, a *attempt1, input, output, answer string) (status, detail string, err error) {
	for name, content := range map[string]string{"input": input, "output": output, "answer": answer} {
		if _, err := a.j.sb.WriteFile(ctx, a.teamID, c.box, Dir+"/t/"+name, "0644", strings.NewReader(content)); err != nil {
			return "", "", fmt.Errorf("write the checker's %s: %w", name, err)
		}
	}
	var stderr, stdout tailBuf
	stderr.keep, stdout.keep = stderrTail, stderrTail
	argv := append(c.l.RunArgv(c.file, c.class), "t/input", "t/output", "t/answer")
	r, err := a.j.sb.Exec(ctx, a.teamID, c.box, client.ExecRequest{
		Argv: argv, Cwd: Dir, User: User, Env: env(c.l), Stdin: new(""),
		Timeout: checkerTimeout, MemoryLimitMB: checkerMemoryMB, MaxOutputBytes: 1 << 20,
	}, &stdout, &stderr)
	if errors.Is(err, apierr.ErrOutOfMemory) {
		c.box = ""
		return "", "", fmt.Errorf("%w: it took its sandbox past its memory: %v", errChecker, err)
	}
	if err != nil {
		return "", "", fmt.Errorf("run the checker: %w", err)
	}
	msg := lastLine(string(stderr.bytes()))
	if msg == "" {
		msg = lastLine(string(stdout.bytes()))
	}
	switch {
	case r.Status == client.StatusError:
		return "", "", fmt.Errorf("run the checker: %s", r.Error)
	case r.Status == client.StatusExited && r.ExitCode == 0:
		return client.TestPassed, "", nil
	case r.Status == client.StatusExited && (r.ExitCode == 1 || r.ExitCode == 2):
		if msg == "" {
			msg = "rejected by the checker"
		}
		return client.TestWrongAnswer, "checker: " + msg, nil
	}
	return "", "", fmt.Errorf("%w: %s, exit code %d, signal %d: %s", errChecker, r.Status, r.ExitCode, r.Signal, msg)
}
