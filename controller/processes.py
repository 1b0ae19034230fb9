"""Handles of the run's processes, as the controller reaches them.

`workers.ray_cluster.placement` starts the processes and fills this in (and `workers.remote_envs`
adds the stand-alone environment servers it attached); the controller only uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from schemas.environments import AttachRequest


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
    policy: object
    env: object | None
    """The run's own environment server (`workers.local_env_server.LocalEnvServer`; None when every
    environment is remote); its `revive()` starts it again on the same port."""
    model_dir: Path
    policy_url: str
    env_url: str | None
    control_token: str
    """Bearer token of the participants' `/checkpoint/*` routes."""
    env_servers: list[EnvServerEndpoint] = field(default_factory=list)
    """Every environment server of the run, the run's own first."""
    reused: bool = False
    """Left running by a controller that crashed, and re-attached (`workers.ray_cluster.survivors`)."""
