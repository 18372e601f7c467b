package interpreter

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestServerParses compiles server.py with the host's python3 (the
// template's is Debian 12's, as the host's is here), and holds the
// commands to the path and port.
func TestServerParses(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed")
	}
	cmd := exec.Command(py, "-c", "import ast, sys; ast.parse(sys.stdin.read(), 'server.py')")
	cmd.Stdin = strings.NewReader(Server)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("server.py does not parse: %v\n%s", err, out)
	}
	if !strings.Contains(StartCmd, Path) {
		t.Errorf("StartCmd %q does not run %s", StartCmd, Path)
	}
	if !strings.Contains(ReadyCmd, ":"+strconv.Itoa(Port)+"/health") {
		t.Errorf("ReadyCmd does not ask port %d", Port)
	}
	if !strings.Contains(Server, `"EVALBOX_INTERPRETER_PORT", "`+strconv.Itoa(Port)+`"`) {
		t.Errorf("server.py does not listen on %d by default", Port)
	}
}
