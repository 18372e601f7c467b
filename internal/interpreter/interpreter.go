// Package interpreter is evalbox's code interpreter: a small server
// (server.py, Python, run inside the sandbox) that keeps stateful Python
// kernels (ipykernel, driven by jupyter_client) and speaks E2B's
// code-interpreter protocol on port 49999. The built-in template
// code-interpreter ships it and starts it in every sandbox; the E2B
// layer and the SDKs reach it through port URLs. This package holds what
// the template and the callers share: the file, its place and port, and
// the commands that start it and wait for it.
package interpreter

import _ "embed"

// Server is server.py.
//
//go:embed server.py
var Server string

// Port is the port the server listens on, on the sandbox's loopback (the
// one the E2B SDKs address).
const Port = 49999

// Path is where the template holds the server.
const Path = "/opt/evalbox/interpreter/server.py"

// StartCmd starts the server (a template's start command: a background
// process of every new sandbox). The debugger's warnings of ipykernel about
// frozen modules are turned off: they would fill the process's output.
const StartCmd = "PYDEVD_DISABLE_FILE_VALIDATION=1 exec python3 -Xfrozen_modules=off " + Path

// ReadyCmd waits for the server's health answer (at most 120 s: a kernel
// starts in a few seconds, longer on a loaded host).
const ReadyCmd = `python3 -c '
import sys, time, urllib.request
for _ in range(1200):
    try:
        urllib.request.urlopen("http://127.0.0.1:49999/health", timeout=1).read()
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit("the code interpreter did not start")'`
