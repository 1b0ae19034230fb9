"""Injected faults for the checkpoint routes (tests and benchmarks only).

The snapshot workflow's retry and compensation paths only run when a participant
misbehaves; a `FaultPlan` makes a real participant misbehave on cue: fail the next N
calls of a route with HTTP 5xx, fail the next N commit writes with ENOSPC, slow a
route down, or slow an environment's tools down. It is served only when the config's
`fault_injection` is on.
"""

from __future__ import annotations

import errno
import os

from turnkeep.schemas.participant import FaultPlan


class FaultInjector:
    def __init__(self) -> None:
        self.plan = FaultPlan()

    def set(self, plan: FaultPlan) -> None:
        # Copied: the counts below are consumed, the caller's plan stays as sent.
        self.plan = plan.model_copy(deep=True)

    def take_failure(self, route: str) -> int | None:
        """The HTTP status to fail this call with, or None to serve it."""
        if _consume(self.plan.fail, route):
            return self.plan.status
        return None

    def delay_s(self, route: str) -> float:
        return self.plan.delay_s.get(route, 0.0)

    def tool_delay_s(self, env: str) -> float:
        return self.plan.tool_delay_s.get(env, 0.0)

    def crash_rollout(self, env: str) -> bool:
        """True when an injected tool crash is due for a rollout of environment `env`."""
        return _consume(self.plan.crash_rollouts, env)

    def enospc(self, route: str) -> None:
        """Raise OSError(ENOSPC) if a disk-full fault is due for `route`'s write."""
        if _consume(self.plan.enospc, route):
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected fault)")


def _consume(counts: dict, route: str) -> bool:
    left = counts.get(route, 0)
    if left <= 0:
        return False
    counts[route] = left - 1
    return True
