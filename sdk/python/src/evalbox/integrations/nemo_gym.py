"""A NeMo Gym sandbox provider on evalbox (``nemo_gym.sandbox``'s ``SandboxProvider`` protocol).

Registered under the entry-point group ``nemo_gym.sandbox_providers`` as ``evalbox``, so that
NeMo Gym finds it once the SDK is installed::

    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec

    spec = SandboxSpec(image="python", resources={"cpu": 1, "memory_mib": 1024})
    async with AsyncSandbox({"evalbox": {"runtime": "gvisor"}}, spec) as sb:
        await sb.start()
        result = await sb.exec("python3 -c 'print(6 * 7)'")

A spec's ``image`` names the template: an entry of the provider's ``images`` mapping, else the
image itself when it is a template name (``python``, ``my-task:v2``); none is ``template``.
Its ``resources`` map to cpu, memory (MiB) and disk (GiB → MiB); GPUs are refused. ``ttl_s`` is
the sandbox's TTL, ``env`` its environment, ``metadata`` its metadata, ``workdir`` is made;
``entrypoint`` runs as a background command. :meth:`EvalboxProvider.endpoint` is a port's URL
with the headers that open it (docs/integrations/nemo-gym.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)

from .._async import AsyncClient, AsyncSandbox
from .._core import TRAFFIC_TOKEN_HEADER
from ..errors import EvalboxError, NotFoundError

__all__ = ["EvalboxProvider"]

_TEMPLATE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}(:[A-Za-z0-9][A-Za-z0-9._-]{0,127})?$")

#: The sandbox states of evalbox and NeMo Gym's.
_STATUS = {
    "running": SandboxStatus.RUNNING,
    "paused": SandboxStatus.STOPPED,
    "deleted": SandboxStatus.STOPPED,
    "expired": SandboxStatus.STOPPED,
    "lost": SandboxStatus.ERROR,
}


_CREATE_TAG = "evalbox-nemo-gym-create"
"""The metadata key of the random tag each create carries (see :meth:`EvalboxProvider.create`)."""


class EvalboxProvider:
    """NeMo Gym's ``SandboxProvider`` on an evalbox server.

    Args:
        api_url: The server (default ``EVALBOX_API_URL``).
        api_key: The team's key (default ``EVALBOX_API_KEY``).
        template: The template of specs without an image (default ``base``).
        images: Image names mapped to templates (``{"python:3.11-slim": "python"}``).
        runtime: ``gvisor`` or ``namespaces`` (default the server's).
        network: The sandboxes' network (``none``, the default, or ``outbound``).
        wait: Seconds a create may queue for room (the team's limit, the host's capacity).
    """

    name = "evalbox"

    def __init__(
        self,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        template: str = "base",
        images: Mapping[str, str] | None = None,
        runtime: str | None = None,
        network: str | None = None,
        wait: float | None = None,
    ) -> None:
        self._url, self._key = api_url, api_key
        self._client: AsyncClient | None = None
        self.template = template
        self.images = dict(images or {})
        self.runtime = runtime
        self.network = network
        self.wait = wait

    def _c(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(self._url, self._key)
        return self._client

    def template_of(self, image: str | None) -> str:
        """The template a spec's image names."""
        if image is None:
            return self.template
        if image in self.images:
            return self.images[image]
        if _TEMPLATE_RE.match(image):
            return image
        raise SandboxCreateError(
            f"image {image!r} is no evalbox template: map it to one in the provider's images= "
            "(e.g. {'" + image + "': 'python'}), or import it (evalbox template import)"
        )

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Create a running sandbox for spec (its template's ready command done)."""
        template = self.template_of(spec.image)
        res = (
            spec.resources
            if isinstance(spec.resources, SandboxResources)
            else SandboxResources.from_mapping(spec.resources)
        )
        if res.gpu:
            raise SandboxCreateError("evalbox sandboxes have no GPUs")
        opts = dict(spec.provider_options)
        # A create cancelled after the server made the sandbox never learns its id: the tag finds
        # it, and it is deleted by that.
        tag = {_CREATE_TAG: secrets.token_hex(8)}
        try:
            sb = await AsyncSandbox.create(
                template,
                runtime=opts.get("runtime", self.runtime),
                timeout=math.ceil(spec.ttl_s) if spec.ttl_s else None,
                cpu=res.cpu,
                memory_mb=res.memory_mib,
                disk_mb=res.disk_gib * 1024 if res.disk_gib else None,
                env=spec.env or None,
                metadata={**(spec.metadata or {}), **tag},
                network=opts.get("network", self.network),
                wait=spec.ready_timeout_s if spec.ready_timeout_s is not None else self.wait,
                client=self._c(),
            )
        except BaseException as e:
            # Failed or cancelled (a lost answer, a timeout, a shutdown) while the server may have
            # made it.
            with contextlib.suppress(Exception):
                await asyncio.shield(AsyncSandbox.kill_all(tag, client=self._c()))
            if isinstance(e, EvalboxError):
                raise SandboxCreateError(f"evalbox could not create a sandbox of {template!r}: {e}") from e
            raise
        try:
            if spec.workdir:
                await sb.files.mkdir(spec.workdir, parents=True)
            if spec.entrypoint:
                await sb.commands.run(list(spec.entrypoint), background=True, cwd=spec.workdir, tag="entrypoint")
        except BaseException as e:
            # Even when cancelled: the sandbox goes, and the first error is the one raised.
            with contextlib.suppress(Exception):
                await asyncio.shield(sb.kill())
            if isinstance(e, EvalboxError):
                raise SandboxCreateError(f"evalbox sandbox {sb.id}: {e}") from e
            raise
        return SandboxHandle(sandbox_id=sb.id, provider_name=self.name, raw=sb)

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Run a shell command; a command past its timeout ends with code 124 (``error_type`` timeout)."""
        sb: AsyncSandbox = handle.raw
        r = await sb.commands.run(
            command, cwd=cwd, env=env, timeout=timeout_s, user=str(user) if user is not None else None
        )
        if r.status == "timed_out":
            return SandboxExecResult(stdout=r.stdout, stderr=r.stderr, return_code=124, error_type="timeout")
        if r.status == "killed":
            return SandboxExecResult(
                stdout=r.stdout, stderr=r.stderr, return_code=128 + (r.signal or 9), error_type="killed"
            )
        if r.status == "error":
            return SandboxExecResult(stdout=r.stdout, stderr=r.stderr or r.error, return_code=-1, error_type="error")
        return SandboxExecResult(stdout=r.stdout, stderr=r.stderr, return_code=r.exit_code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """Copy a local file into the sandbox (streamed; parents made)."""
        sb: AsyncSandbox = handle.raw
        await sb.files.upload(source_path, target_path)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        """Copy a sandbox file to the local filesystem (streamed)."""
        sb: AsyncSandbox = handle.raw
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await sb.files.download(source_path, target_path)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """The sandbox's state as NeMo Gym names it."""
        sb: AsyncSandbox = handle.raw
        try:
            info = await sb.info()
        except NotFoundError:
            return SandboxStatus.STOPPED
        return _STATUS.get(info.state, SandboxStatus.UNKNOWN)

    async def close(self, handle: SandboxHandle) -> None:
        """Delete the sandbox (one already gone is not an error)."""
        sb: AsyncSandbox = handle.raw
        with contextlib.suppress(NotFoundError):
            await sb.kill()

    async def aclose(self) -> None:
        """Close the provider's connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def endpoint(self, handle: SandboxHandle, port: int) -> tuple[str, dict[str, str]]:
        """The URL of ``port`` in the sandbox and the headers that open it (its traffic token)."""
        sb: AsyncSandbox = handle.raw
        return sb.get_url(port), {TRAFFIC_TOKEN_HEADER: sb.traffic_token}
