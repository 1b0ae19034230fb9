"""On a user's cluster (`ray.address`): the run's processes outlive a controller that died alone, for
`ray.survive_controller_s`, as they do on the run's own Ray (whose keeper process watches the controller there).

The warden is a detached actor in the run's namespace. The controller beats it every second; a controller that
starts within the window finds the trainer, the engines and the environment server (`workers.ray_cluster.reattach`)
and beats the same warden. When no beat came for the window, the warden stops the run's processes the way a run
stops them, frees the GPU reservation, and leaves. A run that ends normally stops everything itself, warden too.

A controller that hangs without dying stops beating too: after `ray.controller_hang_s` the warden has a task on the
controller's node (a Ray node: the driver runs on one) kill it by pid, as the run's own keeper does on its own Ray
(`workers.ray_cluster.keeper.kill_if_hung`: its beat file must be as old, and the pid still the controller's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from turnkeep.workers.ray_cluster.gpu_placement import on_head_node
from turnkeep.workers.ray_cluster.keeper import kill_if_hung
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
        self._controller: dict | None = None

    async def beat(self, controller: dict | None = None) -> None:
        """`controller`: the beating controller's `controller_identity` (what a hang kill needs)."""
        self._last = time.monotonic()
        self._controller = controller or self._controller
        if self._watch is None:
            self._watch = asyncio.create_task(self._until_unheard())

    async def _until_unheard(self) -> None:
        while (silent_s := time.monotonic() - self._last) < self._survive_s:
            hang_s = (self._controller or {}).get("hang_s")
            if hang_s and silent_s >= hang_s:
                await self._kill_hung_controller()
            await asyncio.sleep(BEAT_S)
        log.warning("no controller for %.0fs (ray.survive_controller_s): stopping the run's processes", self._survive_s)
        await stop_survivors(find_survivors())
        ray.actor.exit_actor()


    async def _kill_hung_controller(self) -> None:
        controller = self._controller
        where = NodeAffinitySchedulingStrategy(controller["node_id"], soft=False)
        try:
            outcome = await _kill_frozen_controller.options(scheduling_strategy=where).remote(controller)
        except ray.exceptions.RayError as err:  # its node is gone: so is the controller
            log.warning("the controller's node did not run the hang kill (%s)", type(err).__name__)
            outcome = "gone"
        if outcome == "killed":
            log.warning("the controller (pid %d) sent no beat for ray.controller_hang_s = %gs: killed it on its node; "
                        "the run's processes wait for the next one", controller["pid"], controller["hang_s"])
        if outcome != "beating" and self._controller is controller:
            self._controller = None  # dealt with; a new controller's beats bring its own


@ray.remote(num_cpus=0)
def _kill_frozen_controller(controller: dict) -> str:
    """On the controller's node: SIGKILL it when it is still that process and its beat file is as old (one `hang`
    line in its run's metrics.jsonl). "killed", "gone" (it died, its pid may be another process's now), or
    "beating" (its file is younger: ask again)."""
    try:
        if psutil.Process(controller["pid"]).create_time() != controller["create_time"]:
            return "gone"
    except psutil.NoSuchProcess:
        return "gone"
    alive = kill_if_hung(Path(controller["run_dir"]), controller["pid"], controller["hang_s"])
    return "beating" if alive is not None else "killed"


def controller_identity(run_dir: Path, hang_s: float | None) -> dict:
    """What the warden needs to kill this process (the controller) once it hangs."""
    me = psutil.Process()
    return {"pid": me.pid, "create_time": me.create_time(), "node_id": ray.get_runtime_context().get_node_id(),
            "run_dir": str(run_dir), "hang_s": hang_s}


def warden(survive_s: float):
    """The run's warden (the one a dead controller left, or a new one), detached in the run's namespace, on the
    head node where it can be (a worker node that goes away would take it along)."""
    return Warden.options(name=WARDEN, lifetime="detached", get_if_exists=True, **on_head_node()).remote(survive_s)


async def beat_forever(survive_s: float, run_dir: Path, hang_s: float | None) -> None:
    """The controller's heartbeat, from its start to its end; a warden that is gone is started again. `hang_s`:
    `ray.controller_hang_s`."""
    handle = warden(survive_s)
    me = controller_identity(run_dir, hang_s)
    while True:
        try:
            await handle.beat.remote(me)
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
