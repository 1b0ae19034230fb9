"""The run's own environment server: a Ray actor, started again when its process dies alone.

Its URL is the run's for good: a restart binds the same port, so the controller's router
(which marked the server away when its calls failed) finds it again by its usual probe.
The new process is attached in-process at start, as the first one was; its agents are
gone, so their rollouts are retried by the pump's usual rules.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import ray

from turnkeep.envs.env_actor import EnvServerActor
from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.primitives.pid_files import live_pid, write_pid_file
from turnkeep.schemas.choices import MetricsKind
from turnkeep.schemas.config import TurnkeepConfig

log = logging.getLogger("turnkeep.env")


class LocalEnvServer:
    def __init__(self, cfg: TurnkeepConfig, model_dir: Path, policy_urls: Callable[[], list[str]], token: str,
                 incarnation: int | None, identity: dict | None = None, *, placement: Callable[[], dict]) -> None:
        """`policy_urls()`: the live engines' URLs at the moment the server (re)starts; `placement()`: the Ray
        options that place each new process (`workers.ray_cluster.gpu_placement.on_head_node`), asked again at
        every restart since the cluster's nodes may have changed."""
        self._cfg = cfg
        self._placement = placement
        self._model_dir = model_dir
        self._policy_urls = policy_urls
        self._token = token
        self._incarnation = incarnation
        self._identity = identity
        """The run's stamp (`primitives.run_member`): with it, the server is a detached actor that outlives us."""
        self.actor = None
        self.url: str | None = None
        self.restarts = 0

    def adopt(self, actor, url: str, restarts: int) -> None:
        """The server an earlier controller of this run left running (`workers.ray_cluster.reattach`)."""
        self.actor, self.url, self.restarts = actor, url, restarts

    def create(self) -> None:
        """The actor now, not yet started: its process starts and imports while the engines start."""
        self.actor = self._new_actor("env")

    async def start(self) -> str:
        if self.actor is None:
            self.create()
        self.url = await self._started(self._cfg)
        return self.url

    async def revive(self, why: str = "") -> None:
        """Start a new process on the same port. The old one is SIGKILLed by pid first, should it only hang (a
        SIGSTOPped process answers no Ray call either), so it cannot come back beside its replacement."""
        self._kill_if_hung(why)
        if self.actor is not None:
            try:
                ray.kill(self.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is the usual case
                pass
        port = urlsplit(self.url).port
        same_port = self._cfg.model_copy(update={"env": self._cfg.env.model_copy(update={"port": port})})
        self.restarts += 1
        message = (f"the run's environment server ({self.url}) stopped answering ({why or 'gone'}); starting it again on the same port "
                   f"(restart {self.restarts}); its in-flight rollouts run again once it is back, spending no attempt")
        log.warning("%s", message)
        print(f"turnkeep: warning: {message}", file=sys.stderr, flush=True)
        began = time.monotonic()
        url = await self._start(same_port, f"env-restart-{self.restarts}")
        if url != self.url:
            raise RuntimeError(f"the restarted environment server answers at {url}, not {self.url}")
        log.info("the run's environment server is running again at %s", url)
        append_jsonl(self._cfg.run.run_dir / "metrics.jsonl", {
            "kind": MetricsKind.ENV_RESTART, "t": round(time.time(), 3), "restarts": self.restarts, "url": url,
            "seconds": round(time.monotonic() - began, 3)}, durable=False)

    def _kill_if_hung(self, why: str) -> None:
        run_dir = self._cfg.run.run_dir
        pid = live_pid(run_dir, "env")
        if pid is None:
            return  # dead, as usual
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        log.warning("the run's environment server (pid %d) still runs but does not answer (%s): killed it", pid, why)
        append_jsonl(run_dir / "metrics.jsonl", {
            "kind": MetricsKind.HANG, "t": round(time.time(), 3), "target": "env", "pid": pid,
            "probe": "calls and /health", "why": why}, durable=False)

    async def stop(self) -> None:
        if self.actor is not None:
            await self.actor.stop.remote()

    async def _start(self, cfg: TurnkeepConfig, name: str) -> str:
        self.actor = self._new_actor(name)
        return await self._started(cfg)

    def _new_actor(self, name: str):
        detached = {"lifetime": "detached"} if self._identity is not None else {}
        return EnvServerActor.options(name=name, **detached, **self._placement()).remote()

    async def _started(self, cfg: TurnkeepConfig) -> str:
        url = await self.actor.start.remote(str(self._model_dir), self._policy_urls(), cfg.model_dump_json(),
                                            self._token, self._incarnation)
        write_pid_file(cfg.run.run_dir, "env", await self.actor.__ray_call__.remote(_pid_of))
        if self._identity is not None:
            await self.actor.stamp.remote({**self._identity, "model_dir": str(self._model_dir), "url": url,
                                           "restarts": self.restarts})
        return url


def _pid_of(actor) -> int:
    return os.getpid()
