"""On a user's cluster (`ray.address`): the run's processes outlive a controller that died alone, for
`ray.survive_controller_s`, as they do on the run's own Ray (whose keeper process watches the controller there).

The warden is a detached actor in the run's namespace. The controller beats it every second; a controller that
starts within the window finds the trainer, the engines and the environment server (`workers.ray_cluster.reattach`)
and beats the same warden. When no beat came for the window, the warden stops the run's processes the way a run
stops them, frees the GPU reservation, and leaves. A run that ends normally stops everything itself, warden too.
"""

from __future__ import annotations

import asyncio
import logging
import time

import ray

from turnkeep.workers.ray_cluster.gpu_placement import on_head_node
from turnkeep.workers.ray_cluster.survivors import find_survivors, stop_survivors

WARDEN = "warden"
BEAT_S = 1.0

log = logging.getLogger("turnkeep.warden")


@ray.remote(num_cpus=0)
class Warden:
    def __init__(self, survive_s: float) -> None:
        self._survive_s = survive_s
        self._last = time.monotonic()
        self._watch: asyncio.Task | None = None

    async def beat(self) -> None:
        self._last = time.monotonic()
        if self._watch is None:
            self._watch = asyncio.create_task(self._until_unheard())

    async def _until_unheard(self) -> None:
        while time.monotonic() - self._last < self._survive_s:
            await asyncio.sleep(BEAT_S)
        log.warning("no controller for %.0fs (ray.survive_controller_s): stopping the run's processes", self._survive_s)
        await stop_survivors(find_survivors())
        ray.actor.exit_actor()


def warden(survive_s: float):
    """The run's warden (the one a dead controller left, or a new one), detached in the run's namespace, on the
    head node where it can be (a worker node that goes away would take it along)."""
    return Warden.options(name=WARDEN, lifetime="detached", get_if_exists=True, **on_head_node()).remote(survive_s)


async def beat_forever(survive_s: float) -> None:
    """The controller's heartbeat, from its start to its end; a warden that is gone is started again."""
    handle = warden(survive_s)
    while True:
        try:
            await handle.beat.remote()
        except ray.exceptions.RayActorError:
            log.warning("the run's warden is gone; starting another")
            await stop_warden()  # its name stays taken until Ray notices its node is gone
            handle = warden(survive_s)
        await asyncio.sleep(BEAT_S)


async def stop_warden() -> None:
    """A run that ends stops its own processes; its warden has nothing left to watch."""
    try:
        ray.kill(ray.get_actor(WARDEN), no_restart=True)
    except ValueError:
        pass  # none was started
