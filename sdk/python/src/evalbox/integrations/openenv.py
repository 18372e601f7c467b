"""An OpenEnv container provider on evalbox: an OpenEnv env server in a fresh sandbox, reached
through its port URL (``openenv`` 0.10's ``ContainerProvider``).

::

    from openenv.core.env_client import GenericEnvClient
    from evalbox.integrations.openenv import EvalboxProvider

    provider = EvalboxProvider(template="my-env", cmd="python3 -m uvicorn server.app:app --port 8000")
    url = provider.start_container()
    provider.wait_for_ready(url)
    with GenericEnvClient(base_url=url, headers=provider.headers).sync() as env:
        env.reset()
        env.step({"message": "hi"})
    provider.stop_container()

The sandbox starts from a template that holds the env server (an OpenEnv env built into an
evalbox template, e.g. from its Dockerfile: ``evalbox template build -f server/Dockerfile``);
``image`` names a template, or maps to one through ``images``. The server runs as a background
command (``cmd``, else uvicorn on ``app``) on ``port`` of the sandbox's loopback. The URL needs
the sandbox's traffic token (:attr:`EvalboxProvider.headers`); with ``public=True`` the port is
open, for ``EnvClient(provider=...)`` and ``EnvClient.from_docker_image(...)``, which pass no
headers (docs/integrations/openenv.md).
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Mapping
from typing import Any

import httpx
from openenv.core.containers.runtime.providers import ContainerProvider

from .._sync import Client, Sandbox
from ..errors import EvalboxError

__all__ = ["EvalboxProvider"]

DEFAULT_PORT = 8000


class EvalboxProvider(ContainerProvider):
    """OpenEnv's ``ContainerProvider`` on an evalbox sandbox (one per started container)."""

    def __init__(
        self,
        *,
        template: str | None = None,
        images: Mapping[str, str] | None = None,
        cmd: str | None = None,
        app: str = "server.app:app",
        cwd: str | None = None,
        runtime: str | None = None,
        network: str | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        ttl: int = 3600,
        public: bool = False,
        client: Client | None = None,
    ) -> None:
        """
        Args:
            template: The template of the sandboxes (unless ``start_container`` names an image).
            images: Image references → the templates that stand for them.
            cmd: The env server's command line (default: uvicorn serving ``app`` on the port).
            app: The ASGI app uvicorn serves, as ``module:attribute``.
            cwd: The server's working directory (default: the template's).
            runtime: ``gvisor`` or ``namespaces`` (default: the server's).
            network: The sandbox's network (default: the server's, ``none``).
            cpu: vCPUs of the sandbox.
            memory_mb: Memory of the sandbox.
            ttl: The sandbox's TTL in seconds (it is deleted by ``stop_container`` anyway).
            public: Open the port to anyone who can reach evalbox (for clients that send no
                headers); else it needs :attr:`headers`.
            client: The evalbox client (default: the process's, from the environment).
        """
        self._template, self._images, self._cmd, self._app, self._cwd = template, dict(images or {}), cmd, app, cwd
        self._runtime, self._network, self._cpu, self._memory_mb = runtime, network, cpu, memory_mb
        self._ttl, self._public, self._client = ttl, public, client
        self._sandbox: Sandbox | None = None
        self._port = DEFAULT_PORT

    @property
    def sandbox(self) -> Sandbox | None:
        """The running sandbox (``None`` before ``start_container`` and after ``stop_container``)."""
        return self._sandbox

    @property
    def headers(self) -> dict[str, str]:
        """The headers that open the port URL: the sandbox's traffic token."""
        if self._sandbox is None:
            return {}
        return {"X-Evalbox-Traffic-Token": self._sandbox.traffic_token}

    def start_container(
        self,
        image: str | None = None,
        port: int | None = None,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Start a sandbox and its env server; returns the server's base URL (no trailing ``/``)."""
        if self._sandbox is not None:
            raise RuntimeError("this provider already runs a sandbox: stop_container() first")
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        template = self._images.get(image, image) if image else self._template
        if not template:
            raise ValueError("no template: give EvalboxProvider(template=...) or start_container(image=...)")
        self._port = port or DEFAULT_PORT
        try:
            sb = Sandbox.create(
                template=template,
                runtime=self._runtime,
                network=self._network,
                cpu=self._cpu,
                memory_mb=self._memory_mb,
                timeout=self._ttl,
                env=env_vars or None,
                metadata={"via": "openenv"},
                public_ports=[self._port] if self._public else None,
                client=self._client,
            )
        except EvalboxError as e:
            raise RuntimeError(f"evalbox could not start a sandbox of {template!r}: {e}") from e
        self._sandbox = sb
        cmd = self._cmd or f"python3 -m uvicorn {shlex.quote(self._app)} --host 127.0.0.1 --port {self._port}"
        try:
            sb.commands.run(cmd, background=True, cwd=self._cwd, env=env_vars or None, tag="openenv-server")
        except BaseException:
            self.stop_container()
            raise
        return sb.get_url(self._port).rstrip("/")

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Poll the server's ``/health`` until it answers 200; ``TimeoutError`` after ``timeout_s``
        (``RuntimeError``, with its output, when the server has exited)."""
        sb = self._sandbox
        deadline = time.monotonic() + timeout_s
        with httpx.Client(headers=self.headers, timeout=5) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(base_url + "/health").status_code == 200:
                        return
                if sb is not None:
                    procs = [p for p in sb.commands.list() if p.tag == "openenv-server"]
                    if procs and not procs[0].running:
                        r = procs[0].result
                        out = f": {(r.stderr or r.stdout)[-2000:]}" if r is not None else ""
                        raise RuntimeError(f"the env server exited{out}")
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the env server at {base_url} was not ready within {timeout_s:g} s")
                time.sleep(0.2)

    def stop_container(self) -> None:
        """Delete the sandbox (with the server)."""
        sb, self._sandbox = self._sandbox, None
        if sb is not None:
            with contextlib.suppress(EvalboxError):
                sb.kill()

    def close(self) -> None:
        """Delete the sandbox if one still runs."""
        self.stop_container()
