"""Keep the embedded Temporal dev server up for the whole run.

The server holds every workflow history in its database file, so when its process dies
alone (the OOM killer, a stray SIGKILL) nothing is lost but the process: the
supervisor notices within `poll_s`, starts it again on the same database and the same
ports, and waits until it serves. Workers, clients and the run workflow ride through
(the SDK retries while the server is away; `workers.temporal.controller_worker` waits longer
outages out). When restarts keep failing, `lost()` resolves to a one-line reason that
names temporal.log, and the run stops with it.

A server that hangs without dying (a SIGSTOP, a wedged database, a machine swapping) is found by a health check
every `hang_s` / 4 (at most `HANG_PROBE_MAX_EVERY_S`): one that has not answered for `temporal.hang_s` is SIGKILLed
by pid, so it cannot come back half-way beside its replacement, and restarted as a dead one is, with one line and a
`hang` line in metrics.jsonl.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from contextlib import suppress

from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.schemas.choices import MetricsKind
from turnkeep.workers.temporal.dev_server import LOG_FILE, TemporalEndpoint, health_check, restart_dev_server
from turnkeep.workers.temporal.ports import TemporalStartError

log = logging.getLogger("turnkeep.temporal")

POLL_S = 0.5
MAX_FAILURES = 3
"""Failed restarts in a row (within `FAILURE_WINDOW_S`) before the run is stopped."""
FAILURE_WINDOW_S = 60.0
MAX_EXITS = 10
"""Deaths within `FAILURE_WINDOW_S` before the run is stopped, even when every restart served for a moment."""
RESTART_TIMEOUT_S = 30.0
HANG_PROBE_MAX_EVERY_S = 10.0


class TemporalSupervisor:
    def __init__(self, endpoint: TemporalEndpoint, *, poll_s: float = POLL_S, max_failures: int = MAX_FAILURES,
                 window_s: float = FAILURE_WINDOW_S, restart_timeout_s: float = RESTART_TIMEOUT_S,
                 hang_s: float | None = None):
        assert endpoint.run_dir is not None, "only the embedded server is supervised"
        self.endpoint = endpoint
        self.restarts = 0
        """Restarts that brought the server back, this run."""
        self.reason: str | None = None
        """Why the supervisor gave up (None while it has not)."""
        self._poll_s, self._max_failures, self._window_s = poll_s, max_failures, window_s
        self._restart_timeout_s = restart_timeout_s
        self._hang_s = hang_s
        """Seconds without an answer to the health check before the server counts as hung (None: never)."""
        self.hangs = 0
        """Hung servers killed, this run."""
        self._gave_up = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._watch(), name="temporal-supervisor")]
        if self._hang_s is not None:
            self._tasks.append(loop.create_task(self._watch_liveness(self._hang_s), name="temporal-liveness"))

    async def stop(self) -> None:
        """Before the server is stopped on the way out, so that stop is not taken for a death."""
        for task in self._tasks:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.restarts:
            log.info("restarts of the embedded Temporal server this run: %d", self.restarts)

    async def lost(self) -> str:
        """Resolves to a one-line reason when the server is gone for good (restarts kept failing)."""
        await self._gave_up.wait()
        assert self.reason is not None
        return self.reason

    async def _watch(self) -> None:
        failures: deque[float] = deque()
        exits: deque[float] = deque()
        while True:
            await asyncio.sleep(self._poll_s)
            ended = self.endpoint.exit_status()
            if ended is None:
                continue
            now = time.monotonic()
            exits.append(now)
            _forget_before(exits, now - self._window_s)
            if len(exits) > MAX_EXITS:
                return self._give_up(f"it died {len(exits)} times within {self._window_s:.0f}s")
            if await self._restart(ended):
                failures.clear()
                continue
            failures.append(time.monotonic())
            _forget_before(failures, time.monotonic() - self._window_s)
            if len(failures) >= self._max_failures:
                return self._give_up(f"{len(failures)} restarts in a row failed within {self._window_s:.0f}s")

    async def _restart(self, ended: str) -> bool:
        endpoint = self.endpoint
        pid = endpoint.pid
        log.warning("the embedded Temporal server (pid %s) exited unexpectedly (%s); restarting it on %s with the "
                    "same database", pid, ended, endpoint.address)
        began = time.monotonic()
        try:
            await restart_dev_server(endpoint, self._restart_timeout_s)
        except TemporalStartError as err:
            log.warning("restarting the embedded Temporal server failed: %s", err)
            return False
        seconds = time.monotonic() - began
        self.restarts += 1
        log.warning("the embedded Temporal server is back on %s (pid %s, %.1fs after its exit was noticed; "
                    "restart %d of this run)", endpoint.address, endpoint.pid, seconds, self.restarts)
        assert endpoint.run_dir is not None
        append_jsonl(endpoint.run_dir / "metrics.jsonl", {
            "kind": MetricsKind.TEMPORAL_RESTART, "restarts": self.restarts, "old_pid": pid, "pid": endpoint.pid,
            "exit": ended, "seconds": round(seconds, 3), "unix_s": round(time.time(), 3),
        })
        return True

    async def _watch_liveness(self, hang_s: float) -> None:
        """Kill a server that has not answered its health check for `hang_s`; `_watch` then restarts it."""
        every = min(hang_s / 4, HANG_PROBE_MAX_EVERY_S)
        answered = time.monotonic()
        while True:
            await asyncio.sleep(every)
            if self.endpoint.exit_status() is not None:  # dead: `_watch` restarts it; the clock starts again after
                answered = time.monotonic()
                continue
            try:
                await health_check(self.endpoint.address, self.endpoint.namespace, every)
                answered = time.monotonic()
                continue
            except Exception:  # noqa: BLE001 - any failure to answer is a missed probe
                pass
            silent_s = time.monotonic() - answered
            if silent_s >= hang_s:
                self._kill_hung(silent_s, hang_s)
                answered = time.monotonic()

    def _kill_hung(self, silent_s: float, hang_s: float) -> None:
        pid = self.endpoint.pid
        if pid is None:
            return
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.hangs += 1
        why = f"no answer to its health check for {silent_s:.0f}s (temporal.hang_s = {hang_s:g})"
        log.warning("the embedded Temporal server (pid %s) hangs: %s; killed it, it restarts as a dead one does",
                    pid, why)
        assert self.endpoint.run_dir is not None
        append_jsonl(self.endpoint.run_dir / "metrics.jsonl", {
            "kind": MetricsKind.HANG, "t": round(time.time(), 3), "target": "temporal", "pid": pid,
            "probe": "health check", "hang_s": hang_s, "why": why})

    def _give_up(self, why: str) -> None:
        assert self.endpoint.run_dir is not None
        self.reason = (f"the embedded Temporal server could not be kept running ({why}); see "
                       f"{self.endpoint.run_dir / LOG_FILE}")
        log.error("%s", self.reason)
        self._gave_up.set()


def _forget_before(times: deque[float], cutoff: float) -> None:
    while times and times[0] < cutoff:
        times.popleft()
