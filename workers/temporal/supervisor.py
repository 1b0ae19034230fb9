"""Keep the embedded Temporal dev server up for the whole run.

The server holds every workflow history in its database file, so when its process dies
alone (the OOM killer, a stray SIGKILL) nothing is lost but the process: the
supervisor notices within `poll_s`, starts it again on the same database and the same
ports, and waits until it serves. Workers, clients and the run workflow ride through
(the SDK retries while the server is away; `workers.temporal.controller_worker` waits longer
outages out). When restarts keep failing, `lost()` resolves to a one-line reason that
names temporal.log, and the run stops with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import suppress

from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.schemas.choices import MetricsKind
from turnkeep.workers.temporal.dev_server import LOG_FILE, TemporalEndpoint, restart_dev_server
from turnkeep.workers.temporal.ports import TemporalStartError

log = logging.getLogger("turnkeep.temporal")

POLL_S = 0.5
MAX_FAILURES = 3
"""Failed restarts in a row (within `FAILURE_WINDOW_S`) before the run is stopped."""
FAILURE_WINDOW_S = 60.0
MAX_EXITS = 10
"""Deaths within `FAILURE_WINDOW_S` before the run is stopped, even when every restart served for a moment."""
RESTART_TIMEOUT_S = 30.0


class TemporalSupervisor:
    def __init__(self, endpoint: TemporalEndpoint, *, poll_s: float = POLL_S, max_failures: int = MAX_FAILURES,
                 window_s: float = FAILURE_WINDOW_S, restart_timeout_s: float = RESTART_TIMEOUT_S):
        assert endpoint.run_dir is not None, "only the embedded server is supervised"
        self.endpoint = endpoint
        self.restarts = 0
        """Restarts that brought the server back, this run."""
        self.reason: str | None = None
        """Why the supervisor gave up (None while it has not)."""
        self._poll_s, self._max_failures, self._window_s = poll_s, max_failures, window_s
        self._restart_timeout_s = restart_timeout_s
        self._gave_up = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="temporal-supervisor")

    async def stop(self) -> None:
        """Before the server is stopped on the way out, so that stop is not taken for a death."""
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
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

    def _give_up(self, why: str) -> None:
        assert self.endpoint.run_dir is not None
        self.reason = (f"the embedded Temporal server could not be kept running ({why}); see "
                       f"{self.endpoint.run_dir / LOG_FILE}")
        log.error("%s", self.reason)
        self._gave_up.set()


def _forget_before(times: deque[float], cutoff: float) -> None:
    while times and times[0] < cutoff:
        times.popleft()
