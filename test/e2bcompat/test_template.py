"""The e2b SDK's template builder (Template.build), unchanged, against evalbox's build API: files,
steps, users, modes, a start command and its ready check, a Dockerfile, failures that point at
their step, and the upload URLs' guard."""

from __future__ import annotations

import inspect
import io
import tarfile
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from .conftest import Server

READY = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000))\""


def test_build_and_create(key: str, server: Server, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "app" / "lib").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("from lib.util import X\nprint('hello from main', X)\n")
    (ctx / "app" / "lib" / "util.py").write_text("X = 42\n")
    (ctx / "requirements.txt").write_text("nothing to install\n")
    (ctx / "notes.md").write_text("the notes\n")
    (ctx / "other.txt").write_text("not copied\n")
    template = (
        Template(file_context_path=str(ctx))
        .from_template("python")
        .set_envs({"GREETING": "hi there"})
        .copy("requirements.txt", "/opt/app/")
        .copy("app", "/opt/app/src", mode=0o750)
        .copy("*.md", "/opt/docs/", user="nobody")
        .run_cmd("useradd -m builder")
        .run_cmd("id -un > ~/whoami && pwd > ~/where", user="builder")
        .set_workdir("/opt/app")
        .set_start_cmd("python3 -m http.server 8000 --directory /opt/app", READY)
    )
    logs: list[str] = []
    info = Template.build(
        template, "e2b-built", cpu_count=1, memory_mb=512, on_build_logs=lambda e: logs.append(e.message)
    )
    assert info.template_id == "e2b-built"
    assert Template.exists("e2b-built")
    assert not Template.exists("e2b-never-built")
    assert any("useradd -m builder" in line for line in logs), logs

    # The same files again: the SDK finds them uploaded and skips them.
    logs.clear()
    Template.build(template, "e2b-built", on_build_logs=lambda e: logs.append(e.message))
    assert any("already cached" in line for line in logs), logs

    with Sandbox.create("e2b-built", timeout=120) as sb:
        r = sb.commands.run(
            'cat /opt/app/requirements.txt && python3 src/main.py && echo "$GREETING" && pwd'
            " && stat -c '%a %U' src/main.py src/lib/util.py /opt/docs/notes.md"
            " && cat /home/builder/whoami && ls /opt/docs"
        )
        assert r.stdout.splitlines() == [
            "nothing to install",
            "hello from main 42",
            "hi there",
            "/opt/app",
            "750 root",
            "750 root",
            "644 nobody",
            "builder",
            "notes.md",
        ]
        # The start command runs, and was ready before the sandbox was handed out.
        r = sb.commands.run(
            "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/requirements.txt').read().decode())\""
        )
        assert r.stdout.strip() == "nothing to install"


def test_dockerfile(key: str) -> None:
    # FROM names one of evalbox's templates: it works offline. Without a USER the SDK ends the
    # build with E2B's user, "user", whom every E2B template has: so does this one.
    dockerfile = "FROM python\nENV MODE=docker\nRUN echo built > /built\nWORKDIR /srv\nRUN pwd > /srv/where\n"
    Template.build(Template().from_dockerfile(dockerfile), "e2b-dockerfile")
    with Sandbox.create("e2b-dockerfile", timeout=60) as sb:
        r = sb.commands.run("cat /built /srv/where; echo $MODE; whoami; pwd")
        assert r.stdout.split() == ["built", "/srv", "docker", "user", "/srv"]


def test_build_failures(key: str) -> None:
    t = Template().from_template("base").run_cmd("echo before")
    failing_line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    t = t.run_cmd("echo it broke >&2; exit 3")
    with pytest.raises(BuildException) as e:
        Template.build(t, "e2b-broken")
    assert "exit code 3" in str(e.value), str(e.value)
    assert "it broke" in str(e.value), str(e.value)
    # The SDK points at the failing step's line: evalbox said which step failed.
    lines = []
    tb = e.value.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == __file__:
            lines.append(tb.tb_lineno)
        tb = tb.tb_next
    assert failing_line in lines, (failing_line, lines)
    assert not Template.exists("e2b-broken")

    # An image this server never imported: a clear refusal, not a pull.
    with pytest.raises(BuildException, match="import"):
        Template.build(Template().from_image("python:3.12-slim").run_cmd("true"), "e2b-pull")
    with pytest.raises(BuildException, match="built-in template"):
        Template.build(Template().from_template("base"), "python")
    with pytest.raises(BuildException, match="no spaces"):
        Template.build(Template().from_template("base"), "e2b-badtag:no spaces")
    with pytest.raises(BuildException, match="a build ID cannot be a tag"):
        Template.build(Template().from_template("base"), "e2b-badtag", tags=["bld_aaaaaaaaaaaaaaaa"])
    assert not Template.exists("e2b-badtag")


def _tar(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in entries.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_upload_urls(key: str, server: Server) -> None:
    """Upload URLs work for one team and one hash, only with their signature; what is uploaded
    must be a tar whose names stay inside it; another team sees none of it."""
    h = {"X-API-KEY": key}
    digest = "ab" * 32
    link = httpx.get(f"{server.url}/templates/any/files/{digest}", headers=h).json()
    assert link["present"] is False
    assert link["url"].startswith(server.url)
    url = link["url"]
    assert httpx.put(url, content=b"not a tar at all").status_code == 400
    assert httpx.put(url, content=_tar({"../escape": b"x"})).status_code == 400
    assert httpx.put(url.replace("sig=ebx_", "sig=ebx_x"), content=_tar({"a": b"x"})).status_code == 401
    assert httpx.put(url.replace(digest, "cd" * 32), content=_tar({"a": b"x"})).status_code == 401
    assert httpx.get(f"{server.url}/templates/any/files/not-a-hash", headers=h).status_code == 400
    assert httpx.put(url, content=_tar({"a.txt": b"x"})).status_code == 200
    assert httpx.get(f"{server.url}/templates/any/files/{digest}", headers=h).json() == {"present": True}
    other = server.new_team(max_sandboxes=1)
    theirs = httpx.get(f"{server.url}/templates/any/files/{digest}", headers={"X-API-KEY": other})
    assert theirs.json()["present"] is False
    # The build API needs a key; another team's builds are not found.
    r = httpx.post(f"{server.url}/v3/templates", json={"name": "e2b-x"})
    assert r.status_code == 401
    bid = httpx.post(f"{server.url}/v3/templates", json={"name": "e2b-x"}, headers=h).json()["buildID"]
    assert httpx.get(f"{server.url}/templates/e2b-x/builds/{bid}/status", headers=h).json()["status"] == "waiting"
    r = httpx.get(f"{server.url}/templates/e2b-x/builds/{bid}/status", headers={"X-API-KEY": other})
    assert r.status_code == 404
    start = {"fromTemplate": "base", "steps": []}
    r = httpx.post(f"{server.url}/v2/templates/e2b-x/builds/{bid}", json=start, headers={"X-API-KEY": other})
    assert r.status_code == 404


def test_tags(key: str) -> None:
    """Tags as E2B has them: a build under name:tag and extra tags, get/assign/remove, sandboxes
    from a tag and from a build ID (Harbor's way), and 'does not exist' for an unknown tag."""
    one = Template.build(Template().from_template("base").run_cmd("echo one > /v"), "e2b-tagged:v1")
    two = Template.build(
        Template().from_template("base").run_cmd("echo two > /v"), "e2b-tagged", tags=["v2", "c1-m512-r5"]
    )
    assert one.template_id == two.template_id == "e2b-tagged"
    assert one.build_id != two.build_id
    tags = {t.tag: t.build_id for t in Template.get_tags("e2b-tagged")}
    assert tags == {"v1": one.build_id, "v2": two.build_id, "c1-m512-r5": two.build_id}
    # A name with tags and no default tag exists.
    assert Template.exists("e2b-tagged")

    for ref, want in {
        "e2b-tagged:v1": "one",
        "e2b-tagged:c1-m512-r5": "two",
        f"e2b-tagged:{one.build_id}": "one",
        f"e2b-tagged:{two.build_id}": "two",
    }.items():
        with Sandbox.create(ref, timeout=60) as sb:
            assert sb.commands.run("cat /v").stdout.strip() == want, ref
            assert sb.get_info().template_id == ref

    info = Template.assign_tags("e2b-tagged:v2", ["stable", "default"])
    assert info.build_id == two.build_id
    with Sandbox.create("e2b-tagged", timeout=60) as sb:
        assert sb.commands.run("cat /v").stdout.strip() == "two"

    Template.remove_tags("e2b-tagged", ["v2"])
    assert "v2" not in {t.tag for t in Template.get_tags("e2b-tagged")}
    with pytest.raises(Exception, match="does not exist"):
        Sandbox.create("e2b-tagged:v2", timeout=60)
    with pytest.raises(Exception, match="404"):
        Template.get_tags("e2b-never-tagged")
