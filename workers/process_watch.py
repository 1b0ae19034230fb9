"""Notice when the trainer or the policy server dies alone, and say so in one line.

A call to a Ray actor that is busy waits its turn, but one to an actor that died fails
at once; so one pending `__ray_ready__` call per actor is a liveness probe that costs
nothing while the actor lives and never mistakes a long train step for a death.
The run then stops with a reason naming the process; running `turnkeep run` again
recovers from the last snapshot, as after any crash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import ray.exceptions

log = logging.getLogger("turnkeep.run")

PROBE_INTERVAL_S = 1.0
RESTART_HINT = "run the same command again (same --run-dir) to continue from the last snapshot"


async def first_death(actors: dict[str, object]) -> str:
    """Resolves to a one-line reason when any of `actors` (name -> Ray actor handle) dies."""
    return await first_of(*(_until_dead(name, actor) for name, actor in actors.items()))


async def _until_dead(name: str, actor) -> str:
    while True:
        try:
            await actor.__ray_ready__.remote()
        except ray.exceptions.RayActorError as err:
            reason = death_reason(name, err)
            log.error("%s", reason)
            return reason
        await asyncio.sleep(PROBE_INTERVAL_S)


def death_reason(name: str, err: BaseException) -> str:
    cause = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    return f"the {name} process died ({cause}); {RESTART_HINT}"


async def dead_reason(name: str, actor, timeout_s: float = 10.0) -> str | None:
    """The one-line reason when `actor` is dead now; None when it answers (or is only slow to)."""
    try:
        await asyncio.wait_for(actor.__ray_ready__.remote(), timeout_s)
    except ray.exceptions.RayActorError as err:
        return death_reason(name, err)
    except Exception:  # noqa: BLE001 - slow, or Ray itself unreachable: not known to be dead
        return None
    return None


async def first_of(*watches: Awaitable[str] | None) -> str:
    """The first of several stop reasons (None entries are skipped); the others are cancelled."""
    tasks = [asyncio.ensure_future(watch) for watch in watches if watch is not None]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(iter(done)).result()
    finally:
        for task in tasks:
            task.cancel()
