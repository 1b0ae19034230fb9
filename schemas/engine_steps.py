"""The step that changes how many policy engines a run has: the run workflow's `set_engines` update runs it on the
controller, which starts the new engines (refitted before they take turns) or retires the removed ones (they take
no new turns, finish the ones they have, then stop)."""

from __future__ import annotations

from turnkeep.schemas.steps import Runs, Step
from turnkeep.schemas.wire import Wire


class ScaleEnginesInput(Wire):
    run_id: str
    incarnation: int
    """Controller incarnation; a stale one is refused."""
    engines: list[int]
    """The engine indices the run keeps from now on."""


class ScaleEnginesResult(Wire):
    engines: list[int]
    """The engines the run has now."""
    started: list[int]
    """Engines started, refitted and taking turns."""
    retired: list[int]
    """Engines that finished their turns and stopped."""
    seconds: float
    """From the controller taking the change to the last engine started or stopped."""


ENGINES_SCALE = Step("engines.scale", ScaleEnginesInput, ScaleEnginesResult, Runs.CONTROLLER)
