"""What a process of a run tells a controller that re-attaches to it after a crash.

The trainer, the policy server and the run's environment server are Ray actors that can
outlive their controller (`workers.ray_cluster.head`). The controller that starts one stamps it
with the run's identity; a new controller asks for that stamp before it reuses the
process (the same run and the same config), and fences it with its incarnation.
"""

from __future__ import annotations

import os


class RunMember:
    """Mixed into the run's Ray actors."""

    _stamp: dict | None = None

    async def stamp(self, identity: dict) -> None:
        """`identity`: the run id, the config digest and what the process serves (its URL, the model directory)."""
        self._stamp = {**identity, "pid": os.getpid()}

    async def identity(self) -> dict | None:
        return self._stamp
