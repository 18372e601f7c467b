"""SandboxFusion's API on evalbox (POST /run_code), driven by the real sandbox-fusion client
from PyPI (pinned in constraints.txt; `run_code(..., max_attempts=1)` so that a wrong answer is
not hidden by its retries) and by the exact request verl's code reward builds
(verl/utils/reward_score/sandbox_fusion/utils.py: call_sandbox_api posts this JSON with requests).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import httpx
import pytest
import requests
from sandbox_fusion import (
    CommandRunStatus,
    RunCodeRequest,
    RunJupyterRequest,
    RunStatus,
    run_code,
    run_code_async,
    run_jupyter,
)

from ..conftest import Server


def fusion_sandboxes(s: Server, key: str = "") -> list[str]:
    """The team's running sandboxes made for SandboxFusion requests (key: the admin team's, the
    keyless requests' team)."""
    r = httpx.get(
        s.url + "/v1/sandboxes",
        params={"metadata.via": "sandbox-fusion"},
        headers={"Authorization": f"Bearer {key or s.admin_key}"},
    )
    r.raise_for_status()
    return [str(x["id"]) for x in r.json()["sandboxes"]]


def test_python(keyless_server: Server) -> None:
    resp = run_code(RunCodeRequest(code="print(123)", language="python"), endpoint=keyless_server.url, max_attempts=1)
    assert resp.status == RunStatus.Success, resp
    assert resp.compile_result is None
    assert resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.Finished
    assert resp.run_result.return_code == 0
    assert resp.run_result.stdout == "123\n"
    assert resp.run_result.stderr == ""
    assert resp.run_result.execution_time is not None
    assert resp.run_result.execution_time > 0


def test_failure_is_http_200_failed(keyless_server: Server) -> None:
    resp = run_code(
        RunCodeRequest(code="print('before')\n1/0", language="python"), endpoint=keyless_server.url, max_attempts=1
    )
    assert resp.status == RunStatus.Failed
    assert resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.Finished
    assert resp.run_result.return_code == 1
    assert resp.run_result.stdout == "before\n"
    assert "ZeroDivisionError" in (resp.run_result.stderr or "")


def test_timeout(keyless_server: Server) -> None:
    resp = run_code(
        RunCodeRequest(code="import time\nprint('go', flush=True)\ntime.sleep(60)", language="python", run_timeout=1),
        endpoint=keyless_server.url,
        max_attempts=1,
    )
    assert resp.status == RunStatus.Failed
    assert resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert resp.run_result.stdout == "go\n"
    assert resp.run_result.execution_time is not None
    assert 1 <= resp.run_result.execution_time < 30


def test_stdin_files_fetch(keyless_server: Server) -> None:
    code = (
        "import sys\n"
        "n = int(sys.stdin.readline())\n"
        "data = open('data/in.txt').read()\n"
        "open('out.txt', 'w').write(data * n)\n"
        "print(open('/etc/extra.cfg').read())\n"
    )
    resp = run_code(
        RunCodeRequest(
            code=code,
            language="python",
            stdin="3\n",
            files={
                "data/in.txt": base64.b64encode(b"ab").decode(),
                "/etc/extra.cfg": base64.b64encode(b"cfg").decode(),
            },
            fetch_files=["out.txt", "missing.txt"],
        ),
        endpoint=keyless_server.url,
        max_attempts=1,
    )
    assert resp.status == RunStatus.Success, resp
    assert resp.run_result is not None
    assert resp.run_result.stdout == "cfg\n"
    assert set(resp.files) == {"out.txt"}
    assert base64.b64decode(resp.files["out.txt"]) == b"ababab"


@pytest.mark.parametrize(
    ("language", "code", "out"),
    [
        ("bash", 'read x; echo "got $x"; exit 0', "got 7\n"),
        ("nodejs", "process.stdin.on('data', d => console.log('got ' + d.toString().trim()))", "got 7\n"),
    ],
)
def test_languages(keyless_server: Server, language: str, code: str, out: str) -> None:
    resp = run_code(
        RunCodeRequest(code=code, language=language, stdin="7\n"), endpoint=keyless_server.url, max_attempts=1
    )
    assert resp.status == RunStatus.Success, resp
    assert resp.run_result is not None
    assert resp.run_result.stdout == out


def test_async_client(keyless_server: Server) -> None:
    async def main() -> list[str]:
        reqs = [RunCodeRequest(code=f"print({i} * 2)", language="python") for i in range(4)]
        resps = await asyncio.gather(*(run_code_async(r, endpoint=keyless_server.url, max_attempts=1) for r in reqs))
        return [r.run_result.stdout if r.run_result else "" for r in resps]

    assert asyncio.run(main()) == ["0\n", "2\n", "4\n", "6\n"]


def test_every_call_gets_a_fresh_sandbox(keyless_server: Server) -> None:
    first = run_code(
        RunCodeRequest(code="open('/tmp/mark', 'w').write('x'); open('mark', 'w').write('x')", language="python"),
        endpoint=keyless_server.url,
        max_attempts=1,
    )
    assert first.status == RunStatus.Success, first
    second = run_code(
        RunCodeRequest(code="import os; print(os.path.exists('/tmp/mark'), os.path.exists('mark'))", language="python"),
        endpoint=keyless_server.url,
        max_attempts=1,
    )
    assert second.run_result is not None
    assert second.run_result.stdout == "False False\n"
    assert fusion_sandboxes(keyless_server) == []


def verl_call(url: str, code: str, stdin: str, language: str = "python", timeout: int = 10) -> requests.Response:
    """What verl's call_sandbox_api sends (its payload, headers and timeout), to the URL verl is
    configured with (sandbox_fusion_url)."""
    payload = json.dumps(
        {
            "compile_timeout": timeout,
            "run_timeout": timeout,
            "code": code,
            "stdin": stdin,
            "language": language,
            "files": {},
            "fetch_files": [],
        }
    )
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    return requests.post(url, headers=headers, data=payload, timeout=timeout + timeout + 10)


def test_verl_request(keyless_server: Server) -> None:
    url = keyless_server.url + "/run_code"
    solution = "a, b = map(int, input().split())\nprint(a + b)\n"
    r = verl_call(url, solution, "2 3")
    assert r.status_code == 200
    body = r.json()
    # What verl reads: a Success with run_result Finished, and stdout compared with the answer.
    assert body["status"] == "Success"
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["stdout"].rstrip("\n") == "5"
    assert body["compile_result"] is None
    # A runtime error: Failed, Finished with a non-zero return code (verl's -2).
    r = verl_call(url, "raise SystemExit(3)", "")
    body = r.json()
    assert r.status_code == 200
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["return_code"] == 3
    # A timeout: Failed, TimeLimitExceeded (verl's -3).
    body = verl_call(url, "while True: pass", "", timeout=1).json()
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "TimeLimitExceeded"


def test_cpp(keyless_server: Server) -> None:
    """A compiled language: compile_result, then run_result, in one sandbox (the polyglot template)."""
    code = "#include <iostream>\nint main() { int n; std::cin >> n; std::cout << n * 2 << std::endl; }\n"
    resp = run_code(
        RunCodeRequest(code=code, language="cpp", stdin="21\n"), endpoint=keyless_server.url, max_attempts=1
    )
    assert resp.status == RunStatus.Success, resp
    assert resp.compile_result is not None
    assert resp.compile_result.status == CommandRunStatus.Finished
    assert resp.compile_result.return_code == 0
    assert resp.compile_result.execution_time is not None
    assert resp.compile_result.execution_time > 0
    assert resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.Finished
    assert resp.run_result.return_code == 0
    assert resp.run_result.stdout == "42\n"


def test_compile_error(keyless_server: Server) -> None:
    """A program that does not compile: Failed, the compiler's exit code and stderr, no run_result."""
    resp = run_code(
        RunCodeRequest(code="int main() { return x; }\n", language="cpp"), endpoint=keyless_server.url, max_attempts=1
    )
    assert resp.status == RunStatus.Failed, resp
    assert resp.compile_result is not None
    assert resp.compile_result.status == CommandRunStatus.Finished
    assert resp.compile_result.return_code == 1
    assert "error" in (resp.compile_result.stderr or ""), resp.compile_result
    assert "'x' was not declared" in (resp.compile_result.stderr or "").replace("\u2018", "'").replace("\u2019", "'")
    assert resp.run_result is None


def test_unsupported_language_is_refused_at_once(keyless_server: Server) -> None:
    with pytest.raises(Exception, match=r"422.*php.*python, cpp, c, java, go, rust, nodejs, typescript and bash"):
        run_code(RunCodeRequest(code="<?php echo 1;", language="php"), endpoint=keyless_server.url, max_attempts=1)


def test_key_required_without_the_flag(keyed_server: Server) -> None:
    with pytest.raises(Exception, match="401"):
        run_code(RunCodeRequest(code="print(1)", language="python"), endpoint=keyed_server.url, max_attempts=1)
    key = keyed_server.new_team(max_sandboxes=4)
    # The key in the endpoint URL (basic auth's password), as a bare-URL client can carry it.
    with_key = keyed_server.url.replace("http://", f"http://evalbox:{key}@")
    resp = run_code(RunCodeRequest(code="print(1)", language="python"), endpoint=with_key, max_attempts=1)
    assert resp.status == RunStatus.Success, resp
    r = verl_call(with_key + "/run_code", "print(2)", "")
    assert r.status_code == 200
    assert r.json()["run_result"]["stdout"] == "2\n"
    r = verl_call(keyed_server.url.replace("http://", "http://evalbox:wrong@") + "/run_code", "print(2)", "")
    assert r.status_code == 401
    assert fusion_sandboxes(keyed_server, key) == []


def test_keyless_refuses_what_a_web_page_sends(keyless_server: Server) -> None:
    """A page open in the host's browser can post to a loopback port: a form or a no-cors fetch
    (no JSON type), a request with an Origin, a DNS-rebinding name as Host. None runs keyless,
    and neither does a request whose credentials header is empty."""
    url = keyless_server.url + "/run_code"
    body = json.dumps({"code": "print(1)", "language": "python"})
    port = keyless_server.url.rsplit(":", 1)[1]
    for headers in (
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "application/json", "Origin": "https://evil.example"},
        {"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"},
        {"Content-Type": "application/json", "Host": f"rebind.evil.example:{port}"},
        {"Content-Type": "application/json", "Authorization": ""},
    ):
        r = requests.post(url, data=body, headers=headers, timeout=30)
        assert r.status_code == 401, (headers, r.text)
    # What verl and the client send still runs.
    r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "Success", r.text
    assert fusion_sandboxes(keyless_server) == []


def test_sandbox_cannot_reach_the_server(keyless_server: Server) -> None:
    """With keyless loopback on, code in a sandbox must not reach the server's port: the sandbox's
    loopback is its own, and it has no network to the host."""
    port = keyless_server.url.rsplit(":", 1)[1]
    hosts = ["127.0.0.1", "::1", "localhost", *host_addresses()]
    code = (
        "import socket\n"
        f"for host in {hosts!r}:\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2).close()\n"
        "        print('reached', host)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('done')\n"
    )
    resp = run_code(RunCodeRequest(code=code, language="python"), endpoint=keyless_server.url, max_attempts=1)
    assert resp.run_result is not None
    assert resp.run_result.stdout == "done\n", resp


def host_addresses() -> list[str]:
    """This host's own addresses (its name's, and the one its default route leaves from)."""
    addrs = {str(ai[4][0]) for ai in socket.getaddrinfo(socket.gethostname(), None)}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet: picks the source address
            addrs.add(str(s.getsockname()[0]))
        except OSError:
            pass
    return sorted(a for a in addrs if not a.startswith("127.") and a != "::1")


def test_run_jupyter(keyless_server: Server) -> None:
    """The cells of SandboxFusion's own example, on one kernel of a fresh code-interpreter sandbox."""
    resp = run_jupyter(
        RunJupyterRequest(
            cells=[
                "a = 123",
                "a",
                "print(a)",
                'import sys; sys.stderr.write("stderr message")',
                'raise RuntimeError("error message")',
                "'quoted'",
                "open('out.txt', 'w').write(open('in.txt').read() * 2)",
            ],
            files={"in.txt": base64.b64encode(b"ab").decode()},
            fetch_files=["out.txt"],
        ),
        endpoint=keyless_server.url,
        max_attempts=1,
    )
    assert resp.status == RunStatus.Success, resp
    assert resp.driver is not None
    assert resp.driver.status == CommandRunStatus.Finished
    cells = resp.cells
    assert len(cells) == 7
    assert cells[0].stdout == ""
    assert cells[0].display == []
    assert cells[0].error == []
    assert cells[1].display == [{"text/plain": "123"}]
    assert cells[2].stdout == "123\n"
    assert cells[3].stderr == "stderr message"
    assert len(cells[4].error) == 1
    assert cells[4].error[0]["ename"] == "RuntimeError"
    assert cells[4].error[0]["evalue"] == "error message"
    assert isinstance(cells[4].error[0]["traceback"], list)
    assert cells[5].display == [{"text/plain": "'quoted'"}]
    assert base64.b64decode(resp.files["out.txt"]) == b"abab"
    assert fusion_sandboxes(keyless_server) == []


def test_run_jupyter_timeout(keyless_server: Server) -> None:
    resp = run_jupyter(
        RunJupyterRequest(cells=["x = 1", "import time; time.sleep(60)", "x"], cell_timeout=2),
        endpoint=keyless_server.url,
        max_attempts=1,
    )
    assert resp.status == RunStatus.Failed
    assert resp.driver is not None
    assert resp.driver.status == CommandRunStatus.TimeLimitExceeded
    assert resp.cells == []
    assert fusion_sandboxes(keyless_server) == []
