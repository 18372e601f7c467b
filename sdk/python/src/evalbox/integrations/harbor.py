"""A Harbor environment on evalbox: every trial in a fresh evalbox sandbox.

Select it with ``harbor run -p TASK -a AGENT -e evalbox.integrations.harbor:EvalboxEnvironment``;
``--ek key=value`` sets its options (:class:`EvalboxOptions`: ``api_url``, ``api_key``,
``runtime``, ``template``, ``images``, ``ttl_sec``), else ``EVALBOX_API_URL`` and
``EVALBOX_API_KEY`` are used.

A task's ``environment/Dockerfile`` is built on the server (evalbox's Dockerfile front end: one
stage ``FROM`` a template or an imported image) as the template ``harbor-<content hash>``, once:
later trials and jobs start from it, ``--force-build`` builds it again (its steps come from the
layer cache). A task's ``docker_image`` names a template (or ``images={"ref": "template"}`` maps
it). ``cpus``, ``memory_mb`` and ``storage_mb`` become the sandbox's; the task's network policy
becomes its egress rules (no network, public, or an allow list of hosts, ``*.domain`` and IPs),
and changes live between phases. Files move as one streamed tar each way (docs/integrations/harbor.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import shlex
import tempfile
import uuid
from pathlib import Path
from typing import Any, ClassVar

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import environment_content_hash, require_agent_environment_definition
from harbor.environments.options import EnvironmentOptions
from harbor.environments.tar_transfer import (
    extract_dir_from_file,
    pack_dir_to_file,
    remote_pack_command,
    remote_unpack_command,
    tar_pack_succeeded,
)
from harbor.models.task.config import NetworkMode, NetworkPolicy
from pydantic import Field

from .._async import AsyncClient, AsyncSandbox
from ..errors import BadRequestError, NotFoundError, TemplateBuildError

__all__ = ["EvalboxEnvironment", "EvalboxOptions"]

#: A sandbox's TTL unless ``ttl_sec`` says otherwise: long enough for an agent that runs for
#: hours; the sandbox is deleted at the trial's end anyway, this only bounds a crashed run's.
DEFAULT_TTL_SEC = 6 * 3600


class EvalboxOptions(EnvironmentOptions):
    """``--ek`` options of :class:`EvalboxEnvironment`."""

    api_url: str | None = None
    """The evalbox server (default ``$EVALBOX_API_URL``, else ``http://127.0.0.1:8700``)."""
    api_key: str | None = None
    """The team's API key (default ``$EVALBOX_API_KEY``)."""
    runtime: str | None = None
    """``gvisor`` or ``namespaces`` (default: the server's)."""
    template: str | None = None
    """Start every trial from this template, whatever the task's environment says."""
    images: dict[str, str] = Field(default_factory=dict)
    """A task's ``docker_image`` → the template it stands for."""
    ttl_sec: int = DEFAULT_TTL_SEC
    """Each sandbox's TTL, in seconds."""


class EvalboxEnvironment(BaseEnvironment):
    """Harbor's ``BaseEnvironment`` on an evalbox sandbox (one per trial)."""

    options_model = EvalboxOptions
    options: EvalboxOptions

    # One build of a task's template at a time in this process: parallel trials of a job wait
    # for the first one's build instead of each building it.
    _build_locks: ClassVar[dict[str, asyncio.Lock]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: AsyncClient | None = None
        self._sandbox: AsyncSandbox | None = None

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        # Harbor 0.26 passes the options; 0.25 calls it without (and its base takes none).
        if kwargs is None:
            super().preflight()
        else:
            super().preflight(kwargs)

    @staticmethod
    def type() -> str:
        return "evalbox"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True,
            dynamic_network_policy=True,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        if self.options.template:
            return
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    def _c(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(self.options.api_url, self.options.api_key)
        return self._client

    def _dockerfile(self) -> Path:
        return Path(self.environment_dir) / "Dockerfile"

    async def _template(self, force_build: bool) -> str:
        """The template of this trial's sandbox: the option, the task's image, or its Dockerfile's
        build (made once per content; ``force_build`` makes it again)."""
        if self.options.template:
            return str(self.options.template)
        image = self.task_env_config.docker_image
        if image and not (force_build and self._dockerfile().exists()):
            return str(self.options.images.get(image, image))
        name = "harbor-" + str(environment_content_hash(self.environment_dir))[:16]
        lock = self._build_locks.setdefault(name, asyncio.Lock())
        async with lock:
            c = self._c()
            if not force_build:
                with contextlib.suppress(NotFoundError):
                    await c.templates.get(name)
                    return name
            timeout = self.task_env_config.build_timeout_sec
            self.logger.debug(f"evalbox: building {self._dockerfile()} as template {name}")
            try:
                await c.templates.build(
                    name,
                    dockerfile=self._dockerfile().read_text(),
                    context_dir=self.environment_dir,
                    timeout=float(timeout) if timeout else None,
                )
            except (TemplateBuildError, BadRequestError) as e:
                # The environment's fault, not the agent's: Harbor does not grade it.
                raise SandboxBuildFailedError(f"evalbox could not build {self._dockerfile()}: {e}") from e
        return name

    def _switches(self) -> bool:
        """Whether the task's phases ask for more than one network mode."""
        policies = [self.network_policy, *getattr(self, "_phase_network_policies", ())]
        return len({p.network_mode for p in policies}) > 1

    def _network(self, policy: NetworkPolicy) -> dict[str, Any]:
        """Create (or update) arguments for a Harbor network policy."""
        if policy.network_mode == NetworkMode.NO_NETWORK:
            # A sandbox of network none cannot move to another mode live; one whose phases
            # switch is a rules sandbox that allows nothing while it should have no network.
            return {"network": "rules", "allow": []} if self._switches() else {"network": "none"}
        if policy.network_mode == NetworkMode.PUBLIC:
            return {"network": "outbound"}
        allow: list[str] = []
        for host in policy.allowed_hosts:
            try:
                net = ipaddress.ip_network(host.strip("[]"), strict=False)
            except ValueError:
                allow.append(host)  # a host name or *.domain
            else:
                allow.append(str(net))
        return {"network": "rules", "allow": allow}

    async def start(self, force_build: bool) -> None:
        template = await self._template(force_build)
        net = self._network(self.network_policy)
        # A create cancelled after the server made the sandbox never learns its id: this tag
        # finds it.
        tag = {"evalbox-harbor-create": secrets.token_hex(8)}
        try:
            self._sandbox = await AsyncSandbox.create(
                template,
                runtime=self.options.runtime,
                timeout=self.options.ttl_sec,
                cpu=float(self._effective_cpus) if self._effective_cpus else None,
                memory_mb=self._effective_memory_mb,
                disk_mb=self._effective_storage_mb,
                env=self._startup_env() or None,
                metadata={"via": "harbor", "session": str(self.session_id)[:256], **tag},
                network=net["network"],
                allow=net.get("allow"),
                client=self._c(),
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(AsyncSandbox.kill_all(tag, client=self._c()))
            raise
        try:
            if workdir := self.task_env_config.workdir:
                await self._sandbox.files.mkdir(workdir, parents=True)
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._sandbox.kill())
            self._sandbox = None
            raise

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        net = self._network(network_policy)
        await self._require().network.update(allow=net.get("allow"), mode=net["network"])

    async def stop(self, delete: bool) -> None:
        sb, self._sandbox = self._sandbox, None
        try:
            if sb is not None and delete:
                with contextlib.suppress(NotFoundError):
                    await asyncio.shield(sb.kill())
        finally:
            if self._client is not None:
                await self._client.aclose()
                self._client = None

    def _require(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("the evalbox sandbox is not running: call start() first")
        return self._sandbox

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        sb = self._require()
        user = self._resolve_user(user)
        r = await sb.commands.run(
            ["bash", "-c", command],
            cwd=cwd or self.task_env_config.workdir,
            env=self._merge_env(env),
            timeout=timeout_sec,
            user=str(user) if user is not None else None,
        )
        if r.status == "timed_out":
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        if r.status == "error":
            return ExecResult(stdout=r.stdout, stderr=r.stderr or r.error, return_code=-1)
        code = r.exit_code if r.status == "exited" else 128 + (r.signal or 9)
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._require().files.upload(Path(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        sb = self._require()
        remote = f"/tmp/.evalbox-harbor-{uuid.uuid4().hex[:12]}.tar.gz"
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "dir.tar.gz"
            await asyncio.to_thread(pack_dir_to_file, source_dir, local, compress=True, include_root=False)
            await sb.files.upload(local, remote)
        unpack = remote_unpack_command(remote, target_dir, no_same_owner=True)
        r = await self.exec(f"{unpack}; s=$?; rm -f {shlex.quote(remote)}; exit $s", timeout_sec=600, user="root")
        if r.return_code != 0:
            raise RuntimeError(f"could not unpack the upload into {target_dir!r}: {r.stderr or r.stdout}")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        await self._require().files.download(source_path, target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        sb = self._require()
        remote = f"/tmp/.evalbox-harbor-{uuid.uuid4().hex[:12]}.tar.gz"
        r = await self.exec(remote_pack_command(source_dir, remote), timeout_sec=600, user="root")
        try:
            if not tar_pack_succeeded(r.return_code, stdout=r.stdout, stderr=r.stderr, logger=self.logger):
                raise RuntimeError(f"could not pack {source_dir!r}: {r.stderr or r.stdout}")
            with tempfile.TemporaryDirectory() as tmp:
                local = Path(tmp) / "dir.tar.gz"
                await sb.files.download(remote, local)
                await asyncio.to_thread(extract_dir_from_file, local, target_dir)  # makes target_dir
        finally:
            with contextlib.suppress(Exception):
                await self.exec(f"rm -f {shlex.quote(remote)}", timeout_sec=60, user="root")
