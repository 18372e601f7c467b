"""evalbox's code interpreter: stateful Python kernels behind E2B's code-interpreter protocol.

Runs inside every sandbox of the `code-interpreter` template (its start command), on
127.0.0.1:49999, reached through port URLs: the E2B SDK's `run_code` and evalbox's
`sb.run_code`. It uses the kernel stack of Jupyter (ipykernel kernels driven by jupyter_client,
Debian's packages), one kernel per context:

    POST   /execute {code, context_id?, language?, env_vars?, raw?}  NDJSON lines, then end_of_execution
    POST   /contexts {language?, cwd?}                          {id, language, cwd}
    GET    /contexts                                            [{id, language, cwd}, ...]
    DELETE /contexts/{id}                                       null
    POST   /contexts/{id}/restart                               null (the kernel's state is gone)
    GET    /health                                              "OK"

An execution streams `number_of_executions`, then `stdout` / `stderr` / `result` / `error`
lines in the kernel's order, `keepalive` lines while it is quiet, and `end_of_execution`. A
client that goes away (its timeout) interrupts the kernel, whose state stays. Executions of one
context run one at a time; contexts run in parallel.

It trusts its caller: evalbox's port proxy authenticates every request before it gets here.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jupyter_client.manager import KernelManager

PORT = int(os.environ.get("EVALBOX_INTERPRETER_PORT", "49999"))
DEFAULT_CWD = "/home/user"
KEEPALIVE_SECONDS = 5.0
MAX_BODY = 64 << 20

# MIME types of a display bundle and the result fields they fill.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}

LANGUAGES = {"python": "python3", "": "python3"}


class ClientGone(Exception):
    """The HTTP client closed the connection mid-stream."""


class Context:
    """One kernel, and the lock its executions take in turn."""

    def __init__(self, language: str, cwd: str) -> None:
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.km = KernelManager(kernel_name=LANGUAGES[language])
        self._start()
        self.id = self.km.kernel_id or str(uuid.uuid4())

    def _start(self) -> None:
        os.makedirs(self.cwd, exist_ok=True)
        # Tracebacks without colour codes, and reprs of long lists in full.
        self.km.start_kernel(
            cwd=self.cwd,
            extra_arguments=["--InteractiveShell.colors=NoColor", "--PlainTextFormatter.max_seq_length=0"],
        )
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def restart(self) -> None:
        with self.lock:
            self.kc.stop_channels()
            self.km.restart_kernel(now=True)
            self.kc = self.km.client()
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=120)

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)

    def info(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def run_silent(self, code: str) -> None:
        """Runs code that prints nothing and counts no execution (env setup), and waits for it."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        while True:
            msg = self.kc.get_iopub_msg(timeout=60)
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                return

    def execute(self, code: str, env: dict[str, str] | None, emit: Any, gone: Any, raw: bool = False) -> None:
        """Runs code, calling emit(line) for each protocol line; ClientGone from emit, or gone()
        true while it waits, interrupts it. raw: results and errors also carry Jupyter's own
        content (see _line)."""
        restore: dict[str, str | None] = {}
        if env:
            self.run_silent(
                "import os as __e, json as __j\n"
                f"__evalbox_saved = {{k: __e.environ.get(k) for k in __j.loads({json.dumps(json.dumps(list(env)))})}}\n"
                f"__e.environ.update(__j.loads({json.dumps(json.dumps(env))}))\n"
                "del __e, __j"
            )
            restore = {k: None for k in env}
        try:
            self._stream(code, emit, gone, raw)
        finally:
            if restore:
                self.run_silent(
                    "import os as __e\n"
                    "for __k, __v in __evalbox_saved.items():\n"
                    "    __e.environ.pop(__k, None) if __v is None else __e.environ.__setitem__(__k, __v)\n"
                    "del __e, __evalbox_saved"
                )

    def _stream(self, code: str, emit: Any, gone: Any, raw: bool) -> None:
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        errored = False
        last = time.monotonic()
        try:
            while True:
                try:
                    msg = self.kc.get_iopub_msg(timeout=0.5)
                except queue.Empty:
                    if gone():
                        raise ClientGone from None
                    if time.monotonic() - last >= KEEPALIVE_SECONDS:
                        emit({"type": "keepalive"})
                        last = time.monotonic()
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                t, c = msg["msg_type"], msg["content"]
                if t == "status":
                    if c["execution_state"] == "idle":
                        break
                    continue
                line = _line(t, c, msg["header"].get("date"), raw)
                if line is None:
                    continue
                if line["type"] == "error":
                    if errored:
                        continue
                    errored = True
                emit(line)
                last = time.monotonic()
        except ClientGone:
            self.km.interrupt_kernel()
            # Let the interrupted cell end, so that the next execution starts clean.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    msg = self.kc.get_iopub_msg(timeout=1)
                except queue.Empty:
                    continue
                if (
                    msg["parent_header"].get("msg_id") == msg_id
                    and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"
                ):
                    break
            raise


def _timestamp(date: Any) -> str:
    if isinstance(date, datetime):
        return date.isoformat()
    if isinstance(date, str) and date:
        return date
    return datetime.now(UTC).isoformat()


def _line(msg_type: str, c: dict[str, Any], date: Any, raw: bool = False) -> dict[str, Any] | None:
    """The protocol line of one iopub message of the execution, or None. raw adds Jupyter's own
    content: a result's MIME bundle as "bundle", an error's traceback lines as "traceback_lines"
    (SandboxFusion's run_jupyter answers them as they are)."""
    if msg_type == "execute_input":
        return {"type": "number_of_executions", "execution_count": c.get("execution_count", 0)}
    if msg_type == "stream":
        kind = "stderr" if c.get("name") == "stderr" else "stdout"
        return {"type": kind, "text": c.get("text", ""), "timestamp": _timestamp(date)}
    if msg_type in ("execute_result", "display_data"):
        data = dict(c.get("data") or {})
        line: dict[str, Any] = {"type": "result", "is_main_result": msg_type == "execute_result"}
        for mime, field in MIME_FIELDS.items():
            if mime in data:
                line[field] = data.pop(mime)
        text = line.get("text")
        if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            line["text"] = text[1:-1]
        line["extra"] = data
        if raw:
            line["bundle"] = dict(c.get("data") or {})
        return line
    if msg_type == "error":
        return {
            "type": "error",
            "name": c.get("ename", ""),
            "value": c.get("evalue", ""),
            "traceback": "\n".join(c.get("traceback") or []),
            **({"traceback_lines": list(c.get("traceback") or [])} if raw else {}),
        }
    return None


class Contexts:
    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.by_id: dict[str, Context] = {}
        self.default = self.create("python", DEFAULT_CWD)

    def create(self, language: str, cwd: str) -> Context:
        ctx = Context(language, cwd)
        with self.mu:
            self.by_id[ctx.id] = ctx
        return ctx

    def get(self, cid: str) -> Context | None:
        with self.mu:
            return self.by_id.get(cid)

    def remove(self, cid: str) -> Context | None:
        with self.mu:
            ctx = self.by_id.pop(cid, None)
            if ctx is self.default:
                self.by_id[cid] = ctx  # the default context stays
                return None
        return ctx

    def list(self) -> list[dict[str, str]]:
        with self.mu:
            return [c.info() for c in self.by_id.values()]


def normalize(language: str | None) -> str:
    lang = (language or "").strip().lower()
    return {"py": "python", "python3": "python", "": "python"}.get(lang, lang)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An answer is several small writes (its header, then a line per
    # event): with Nagle's algorithm each waits for the last one's ACK,
    # which the client delays up to 40 ms.
    disable_nagle_algorithm = True
    server_version = "evalbox-interpreter"
    contexts: Contexts

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError(f"body over {MAX_BODY} bytes")
        raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            return {}
        v = json.loads(raw)
        if not isinstance(v, dict):
            raise TypeError("want a JSON object")
        return v

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = (
            body.encode() if isinstance(body, str) and content_type != "application/json" else json.dumps(body).encode()
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _text(self, status: int, msg: str) -> None:
        self._send(status, msg, "text/plain; charset=utf-8")

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, "OK")
        elif self.path == "/contexts":
            self._send(200, self.contexts.list())
        else:
            self._text(404, f"no route GET {self.path}")

    def do_DELETE(self) -> None:
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":
            ctx = self.contexts.get(parts[1])
            if ctx is None:
                self._text(404, f"Context {parts[1]} not found")
                return
            if ctx is self.contexts.default:
                self._text(400, "the default context cannot be removed (restart it)")
                return
            self.contexts.remove(parts[1])
            ctx.shutdown()
            self._send(200, None)
        else:
            self._text(404, f"no route DELETE {self.path}")

    def do_POST(self) -> None:
        try:
            body = self._body()
        except (ValueError, TypeError) as e:
            self._text(400, f"invalid body: {e}")
            return
        parts = self.path.strip("/").split("/")
        if self.path == "/execute":
            self._execute(body)
        elif self.path == "/contexts":
            lang = normalize(body.get("language"))
            if lang not in LANGUAGES:
                self._text(400, f"language {lang!r}: this interpreter runs python")
                return
            try:
                ctx = self.contexts.create(lang, body.get("cwd") or DEFAULT_CWD)
            except Exception as e:
                self._text(500, f"Failed to create context: {e}")
                return
            self._send(200, ctx.info())
        elif len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            ctx = self.contexts.get(parts[1])
            if ctx is None:
                self._text(404, f"Context {parts[1]} not found")
                return
            try:
                ctx.restart()
            except Exception as e:
                self._text(500, f"Failed to restart context {parts[1]}: {e}")
                return
            self._send(200, None)
        else:
            self._text(404, f"no route POST {self.path}")

    def _execute(self, body: dict[str, Any]) -> None:
        code = body.get("code")
        if not isinstance(code, str):
            self._text(400, "code: want a string")
            return
        cid, lang = body.get("context_id"), body.get("language")
        if cid and lang:
            self._text(400, "Only one of context_id or language can be provided")
            return
        env = body.get("env_vars") or None
        if env is not None and (
            not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            self._text(400, "env_vars: want an object of strings")
            return
        if cid:
            ctx = self.contexts.get(cid)
            if ctx is None:
                self._text(404, f"Context {cid} not found")
                return
        else:
            if normalize(lang) not in LANGUAGES:
                self._text(400, f"language {normalize(lang)!r}: this interpreter runs python")
                return
            ctx = self.contexts.default
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(line: dict[str, Any]) -> None:
            data = (json.dumps(line) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError as e:
                raise ClientGone from e

        def gone() -> bool:
            # The client closed its end (it timed out, or was killed).
            try:
                r, _, _ = select.select([self.connection], [], [], 0)
                return bool(r) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        try:
            with ctx.lock:
                ctx.execute(code, env, emit, gone, raw=body.get("raw") is True)
            emit({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except ClientGone:
            self.close_connection = True
        except Exception as e:
            try:
                emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": ""})
                emit({"type": "end_of_execution"})
                self.wfile.write(b"0\r\n\r\n")
            except ClientGone:
                pass
            self.close_connection = True


def main() -> None:
    Handler.contexts = Contexts()
    srv = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    srv.daemon_threads = True
    print(f"evalbox interpreter on 127.0.0.1:{PORT}", file=sys.stderr, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
