"""Attach the stand-alone environment servers (`kind = "remote"`) to this run.

Each one gets the run's policy URL, limits and tokenizer files over `POST /attach`,
takes the environment's name as its participant name, and reports what it can do for
recovery. A server that does not answer, refuses the token, or serves something else
stops the start with one line naming it and the fix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from turnkeep.config.loader import ConfigError
from turnkeep.controller.processes import EnvServerEndpoint, Processes
from turnkeep.controller.pumps.env_client import EnvClient, EnvServerError
from turnkeep.primitives.control_token import ControlTokenError, read_token_file
from turnkeep.schemas.choices import EnvironmentKind
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.environments import AttachRequest, EnvironmentCapabilities

MODEL_FILE_SUFFIXES = (".json", ".jinja", ".txt")
MAX_MODEL_FILE_BYTES = 16 * 1024 * 1024
ATTACH_TIMEOUT_S = 30.0


class RemoteEnvError(ConfigError):
    """A remote environment server cannot be used; the message names it and the fix."""


def model_files(model_dir: Path) -> dict[str, str]:
    """The model directory's tokenizer and config files (text), as a remote server needs them."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(model_dir.iterdir())
            if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES and p.stat().st_size <= MAX_MODEL_FILE_BYTES
            and not p.name.endswith(".index.json")}


async def attach_remote_servers(
    cfg: TurnkeepConfig, processes: Processes, session: aiohttp.ClientSession, run_id: str, incarnation: int
) -> list[EnvironmentCapabilities]:
    """Attach every remote environment (all at once) and add it to `processes.env_servers`."""
    remotes = sorted((name, spec) for name, spec in cfg.environments.items() if spec.kind == EnvironmentKind.REMOTE)
    if not remotes:
        return []
    files = await asyncio.to_thread(model_files, processes.model_dir)
    urls = processes.engines.routable_urls()
    requests = [
        AttachRequest(run_id=run_id, incarnation=incarnation, name=name, policy_url=urls[0], policy_urls=urls,
                      limits=cfg.rollout_limits(), model_files=files, group_size=cfg.rollout.group_size)
        for name, _ in remotes
    ]
    replies = await asyncio.gather(*(
        _attach_one(name, spec.url, spec.token_file, request, session)
        for (name, spec), request in zip(remotes, requests, strict=True)
    ))
    reported = []
    for endpoint, caps in replies:
        processes.env_servers.append(endpoint)
        reported += caps
    return reported


async def probe_remote_servers(cfg: TurnkeepConfig) -> None:
    """Before anything is written: every remote environment server answers its /health and takes the token in its
    `token_file` (a refusal found only at attach came after Temporal, Ray, the trainer and vLLM had started)."""
    remotes = sorted((name, spec) for name, spec in cfg.environments.items() if spec.kind == EnvironmentKind.REMOTE)
    if not remotes:
        return
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for name, spec in remotes:
            token = _token(name, spec.token_file)
            url = spec.url.rstrip("/")
            try:
                async with session.get(f"{url}/health") as resp:
                    await resp.read()
                async with session.get(f"{url}/auth", headers={"Authorization": f"Bearer {token}"}) as resp:
                    status = resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
                raise RemoteEnvError(
                    f"environments.{name}: the environment server at {spec.url} does not answer "
                    f"({type(err).__name__}: {err}); start it first: turnkeep env-server --entry "
                    f"package.module:Class --port <port> --token-file {spec.token_file}"
                ) from None
            if status == 401:
                raise _token_refused(name, spec.url, spec.token_file)
            # 404: a server from before /auth existed; the attach checks the token then.


def _token(name: str, token_file: Path) -> str:
    try:
        return read_token_file(Path(token_file).expanduser(), "copy the --token-file of its turnkeep env-server here")
    except ControlTokenError as err:
        raise RemoteEnvError(f"environments.{name}.token_file: {err}") from None


def _token_refused(name: str, url: str, token_file: Path) -> RemoteEnvError:
    return RemoteEnvError(f"environments.{name}: the server at {url} refuses the token in {token_file}; give the file "
                          "its turnkeep env-server was started with (--token-file)")


async def _attach_one(name: str, url: str, token_file: Path, request: AttachRequest, session):
    where = f"environments.{name}"
    token = _token(name, token_file)
    client = EnvClient(url, session, token, name)
    try:
        reply = await asyncio.wait_for(client.attach(request), ATTACH_TIMEOUT_S)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        raise RemoteEnvError(
            f"{where}: the environment server at {url} does not answer ({type(err).__name__}: {err}); start it "
            f"first: turnkeep env-server --entry package.module:Class --port <port> --token-file {token_file}"
        ) from None
    except EnvServerError as err:
        if "HTTP 401" in str(err):
            raise _token_refused(name, url, token_file) from None
        raise RemoteEnvError(f"{where}: the server at {url} refused to attach: {err}") from None
    names = [caps.name for caps in reply.environments]
    if reply.name != name or names != [name]:
        raise RemoteEnvError(
            f"{where}: the server at {url} answers as {reply.name!r} serving {names}, not one environment {name!r}; "
            "run one turnkeep env-server per remote environment"
        )
    return EnvServerEndpoint(name, url, token, [name], attach=request), reply.environments
