"""What a controller of this run left running in the run's Ray namespace (the trainer, the engines, the run's
environment server): found by their names, and stopped. A restarted controller re-attaches to them
(`workers.ray_cluster.reattach`); a run on a user's cluster stops them at its end, and its warden when no
controller beats it any more (`workers.ray_cluster.warden`).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import get_placement_group, remove_placement_group

STOP_TIMEOUT_S = 30.0
ENV_ACTOR = re.compile(r"^env(?:-restart-(\d+))?$")
ENGINE_ACTOR = re.compile(r"^policy\.(\d+)$")
KEEPER_ACTOR = re.compile(r"^shard_keeper\.(\d+)$")
GPU_GROUP = "turnkeep-gpus"


@dataclass(frozen=True)
class Found:
    trainer: object | None
    engines: dict[int, object]
    """Engine index -> its actor."""
    env: object | None
    env_restarts: int
    keepers: dict[int, object] = field(default_factory=dict)
    """Trainer rank -> the keeper of its shard's copies (`gpu_workers.shard_keeper`): found to be stopped; a new
    trainer finds them by name itself."""

    def handles(self) -> list:
        return [h for h in (self.trainer, *self.engines.values(), self.env, *self.keepers.values()) if h is not None]


def find_survivors() -> Found:
    """The run's named actors in this Ray namespace (the newest environment server if it was restarted)."""
    names = set(ray.util.list_named_actors())
    env_name, env_restarts = None, -1
    for name in names:
        if (match := ENV_ACTOR.match(name)) and int(match.group(1) or 0) > env_restarts:
            env_name, env_restarts = name, int(match.group(1) or 0)
    get = lambda name: ray.get_actor(name) if name in names else None  # noqa: E731
    engines = {int(match.group(1)): ray.get_actor(name) for name in names if (match := ENGINE_ACTOR.match(name))}
    keepers = {int(match.group(1)): ray.get_actor(name) for name in names if (match := KEEPER_ACTOR.match(name))}
    return Found(get("trainer"), engines, get(env_name) if env_name else None, max(env_restarts, 0), keepers)


def get_gpu_group():
    """The run's GPU reservation a replacement engine is placed in (None: none was made)."""
    try:
        return get_placement_group(GPU_GROUP)
    except Exception:  # noqa: BLE001 - none reserved (no GPUs)
        return None


async def stop_survivors(found: Found) -> None:
    """Stopped the way a run stops them (vLLM's engine processes go with the policy server), then killed."""
    for handle in (found.env, *found.engines.values()):
        if handle is not None:
            try:
                await asyncio.wait_for(handle.stop.remote(), STOP_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - dead or hung: the kill below does it
                pass
    for handle in found.handles():
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass
    try:
        remove_placement_group(get_placement_group(GPU_GROUP))
    except Exception:  # noqa: BLE001 - none reserved (no GPUs), or already gone
        pass
    # The new processes take the same names, which are free once Ray has seen the old ones die.
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while find_survivors().handles() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
