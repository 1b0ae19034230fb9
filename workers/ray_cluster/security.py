"""Ray locked down: a local Ray listens on loopback only, and every Ray turnkeep starts or
joins checks a token.

Ray reads both settings from the environment when it is imported, so the CLI sets them
before anything imports Ray (`ray_environment`), and `start_ray` makes or checks the
token file before `ray.init`:

- local (no `ray.address`): `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` makes Ray take the
  loopback address as the node's (it otherwise swaps 127.0.0.1 for the machine's
  reachable address), so GCS, raylet, workers and agents bind 127.0.0.1; vLLM's own
  process group binds there too (`VLLM_HOST_IP`). The token is made in
  `<run_dir>/ray_token` (0600) unless `ray.token_file` names one.
- joining a cluster (`ray.address`): the cluster's token must already be in
  `ray.token_file` (or `<run_dir>/ray_token`); docs/cluster.md shows how a cluster is started
  with it.
"""

from __future__ import annotations

import os
from pathlib import Path

from turnkeep.config.loader import ConfigError
from turnkeep.primitives.control_token import ControlTokenError, create_token_file, read_token_file
from turnkeep.schemas.config import TurnkeepConfig

RAY_TOKEN_FILE = "ray_token"


class RayTokenError(ConfigError):
    """The Ray token for a cluster is missing or readable by others; the message says how to fix it."""


def ray_token_path(cfg: TurnkeepConfig) -> Path:
    return (cfg.ray.token_file or cfg.run.run_dir / RAY_TOKEN_FILE).expanduser().resolve()


def ray_environment(cfg: TurnkeepConfig) -> dict[str, str]:
    """The variables Ray (and vLLM) must see before they are imported."""
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(ray_token_path(cfg))}
    if cfg.ray.address is None:
        env |= {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "VLLM_HOST_IP": "127.0.0.1"}
    return env


def apply_ray_environment(cfg: TurnkeepConfig) -> None:
    if cfg.ray.address is not None:
        # A local run's loopback settings (inherited from a parent that ran one) would refuse a cluster.
        for local_only in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "VLLM_HOST_IP"):
            os.environ.pop(local_only, None)
    os.environ.update(ray_environment(cfg))


def ensure_ray_token(cfg: TurnkeepConfig) -> None:
    """Make the local Ray's token (0600), or check that a cluster's token is there; called before ray.init."""
    if os.environ.get("RAY_AUTH_MODE") != "token":
        return  # a caller that imported Ray with authentication off (the test suite's shared stack)
    path = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    try:
        if cfg.ray.address is None:
            create_token_file(path)
        else:
            read_token_file(path, how_made=(
                "a cluster's token is made when the cluster is started: RAY_AUTH_MODE=token ray get-auth-token "
                "--generate, then start every node with RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<that file>, and "
                "give the same file as ray.token_file"))
    except ControlTokenError as err:
        raise RayTokenError(f"Ray token: {err}") from None
