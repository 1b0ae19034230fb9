"""How a run's pumps end: the first of the rollout pump, the train pump, a stop request and the run's watch (a
process that died, the run workflow that stopped the run) decides, and the rest are stopped rather than waited for.

Either pump alone would wait for the other for good (the train pump for rows that never come), so a failed pump
stops the run with one line; a death the watch names beats the pump's raw error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from turnkeep.controller.errors import RunStopped

log = logging.getLogger("turnkeep.run")

WATCH_GRACE_S = 5.0
"""How long a failed pump waits for the run's watch to name the death that caused it."""


async def supervise_pumps(rollout_task: asyncio.Task, train_task: asyncio.Task, stop_task: asyncio.Task,
                          watch: Awaitable[str] | None) -> None:
    """Wait for the first of the pumps, a stop request and the watch; stop the rest, and raise RunStopped with one
    line when a pump failed or the watch named a death."""
    tasks = {rollout_task, train_task, stop_task}
    watch_task = asyncio.ensure_future(watch) if watch is not None else None
    if watch_task is not None:
        tasks.add(watch_task)
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    if watch_task is not None and watch_task not in done and any(_failed(task) for task in done):
        # A pump that failed because a process died: the watch names that death in a moment, and a
        # reason beats the pump's raw error.
        done |= (await asyncio.wait({watch_task}, timeout=WATCH_GRACE_S))[0]
    if watch_task is not None and watch_task in done and not watch_task.cancelled() \
            and watch_task.exception() is None:
        for task in tasks - {watch_task}:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise RunStopped(watch_task.result())
    if failed := [task for task in (rollout_task, train_task) if task in done and _failed(task)]:
        # Either pump alone would wait for the other for good (the train pump for rows that never come).
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        err = failed[0].exception()
        log.error("the %s failed", failed[0].get_name(), exc_info=err)
        raise RunStopped(f"the {failed[0].get_name()} failed: {type(err).__name__}: {err} (the log has the "
                         "details); the last snapshot stays the restore point: run the same command again (same "
                         "--run-dir) once the cause is fixed") from err
    for task in (rollout_task, watch_task, stop_task):
        if task is not None and task not in done:
            task.cancel()
    if (watch_task in done or stop_task in done) and train_task not in done:
        train_task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if task is stop_task:
            continue
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    if watch_task is not None and watch_task in done and not watch_task.cancelled():
        raise RunStopped(watch_task.result())


def _failed(task: asyncio.Task) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None
