"""Local activities for the workflow thread that run the controller's own activity code on
the controller's event loop.

A local activity runs in the worker that runs its workflow: here the workflow thread, with
its own loop. The controller's activities change objects that live on the controller's
loop (the data plane, the stores, the HTTP session), so each local activity hands its call
over to that loop and waits for the answer. The activity's context (its info, its
timeouts) travels with the call; a cancelled call still runs to its end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, get_type_hints

from temporalio import activity


def on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine) -> concurrent.futures.Future:
    """Run `coro` on `loop` (another thread's) in the caller's context; cancelling the future cancels the task."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    context = contextvars.copy_context()

    def start() -> None:
        if future.cancelled():
            coro.close()
            return
        task = asyncio.ensure_future(coro)  # a task takes the current context: the caller's copy
        task.add_done_callback(functools.partial(_settle, future))
        future.add_done_callback(lambda done: loop.call_soon_threadsafe(task.cancel) if done.cancelled() else None)

    loop.call_soon_threadsafe(start, context=context)
    return future


def _settle(future: concurrent.futures.Future, task: asyncio.Task) -> None:
    if future.done():  # cancelled by the caller meanwhile
        return
    if task.cancelled():
        future.cancel()
    elif task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())


@dataclass(frozen=True)
class BridgedRun:
    """One local activity's clocks. Under load the two stamps of Temporal's marker for a local activity are not one
    clock, so `turnkeep bench orchestration` reads these to tell time inside the activity from time around it."""
    activity: str
    workflow_id: str
    workflow_run_id: str
    attempt: int
    wall_s: float
    """From the workflow thread handing the call over until it has the answer back."""
    loop_wait_s: float
    """Before the controller's loop began the call: the hop, and the loop busy with the pumps."""
    run_s: float
    """The activity's own code on the controller's loop."""


def bridged(fn: Callable[[Any], Coroutine], name: str, loop: asyncio.AbstractEventLoop,
            record: Callable[[BridgedRun], None] | None = None) -> Callable:
    """`fn`, the controller's activity `name`, as an activity of the same name and types that runs it on `loop`;
    `record`, when given, gets each finished call's clocks on `loop`."""
    @functools.wraps(fn, updated=())  # not its __dict__: that holds the original's activity definition
    async def call(arg):
        handed = time.perf_counter()
        clocks: list[float] = []

        async def timed():
            began = time.perf_counter()
            try:
                return await fn(arg)
            finally:
                clocks[:] = [began - handed, time.perf_counter() - began]

        running = asyncio.wrap_future(on_loop(loop, timed()))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            # A started phase runs to its end, as an ordinary activity without heartbeats would (half a publish
            # is worse than a late one): the cancelled workflow waits for it, so its compensation never races it.
            await asyncio.wait([running])
            raise
        finally:
            if record is not None and clocks:
                info = activity.info()
                run = BridgedRun(name, info.workflow_id or "", info.workflow_run_id or "", info.attempt,
                                 time.perf_counter() - handed, *clocks)
                loop.call_soon_threadsafe(record, run)

    call.__annotations__ = get_type_hints(fn)
    return activity.defn(name=name)(call)


def bridged_activities(fns: Iterable[Callable], names: Iterable[str], loop: asyncio.AbstractEventLoop,
                       record: Callable[[BridgedRun], None] | None = None) -> list:
    """The activities among `fns` whose names are in `names`, bridged to `loop` (each call's clocks to `record`)."""
    by_name = {activity._Definition.must_from_callable(fn).name: fn for fn in fns}  # noqa: SLF001 - the SDK's record
    missing = set(names) - set(by_name)
    if missing:
        raise ValueError(f"no controller activity is named {sorted(missing)}: every local activity needs one")
    return [bridged(by_name[name], name, loop, record) for name in sorted(set(names))]
