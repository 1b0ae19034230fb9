"""Handles of the run's processes, as the controller reaches them.

`workers.ray_cluster.placement` starts the processes and fills this in (and `workers.remote_envs`
adds the stand-alone environment servers it attached); the controller only uses it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from turnkeep.controller.engines.engine_pool import Engine, EnginePool
from turnkeep.schemas.environments import AttachRequest


class OwnEnvServer(Protocol):
    """The run's own environment server as the controller sees it (`workers.local_env_server.LocalEnvServer`)."""

    async def revive(self, why: str = "") -> None:
        """Start it again on the same port; `why`: what the probe that gave up on it last saw."""


@dataclass(frozen=True)
class EnvServerEndpoint:
    name: str
    """Participant name: `env` for the run's own server, the environment's name for a remote one."""
    url: str
    token: str
    """Bearer token of every route but /health."""
    environments: list[str]
    """The run's environment names it runs."""
    attach: AttachRequest | None = None
    """Stand-alone servers only: how the run attaches it (again, after the server restarts)."""

    @property
    def remote(self) -> bool:
        """A stand-alone server, maybe on another machine: snapshot files travel inside the HTTP calls."""
        return self.attach is not None


@dataclass
class Processes:
    trainer: object
    engines: EnginePool
    """The policy engines (`policy.engines` of them; their keeper replaces the ones that die)."""
    env: OwnEnvServer | None
    """The run's own environment server (`workers.local_env_server.LocalEnvServer`; None when every
    environment is remote); its `revive()` starts it again on the same port."""
    model_dir: Path
    env_url: str | None
    control_token: str
    """Bearer token of the participants' `/checkpoint/*` routes."""
    env_servers: list[EnvServerEndpoint] = field(default_factory=list)
    """Every environment server of the run, the run's own first."""
    reused: bool = False
    """Left running by a controller that crashed, and re-attached (`workers.ray_cluster.reattach`)."""
    new_trainer: bool = False
    """Re-attached, but with a new trainer: the one left running had died (`train.max_rebuilds`)."""
    spawn_engine: Callable[[int, int], Awaitable[Engine]] | None = None
    """Starts engine k anew (its n-th replacement): `workers.ray_cluster.engines.EngineStarter.spawn`."""

    @property
    def policy(self) -> object:
        """One engine's actor (the lowest-numbered live one), for what asks a single engine."""
        return self.engines.first().actor

    @property
    def policy_url(self) -> str:
        return self.engines.first().url
