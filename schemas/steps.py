"""A step of a workflow: one activity's contract, declared once beside its models.

A `Step` is its activity's name (it is a `str`, so the recorded histories and the
`@activity.defn(name=...)` of its implementation spell exactly that), the model that goes
in, the model that comes out, and where it runs. The workflows call steps through it (the
result type and the task queue follow), the workers register every implementation their
activity classes define and check it against its step at start (`primitives.temporal_client`),
and the controller's local activities are the steps that say so. Adding a step is its models
and one `Step(...)` line in `schemas/` (`attempt_steps.py`, `recovery.py`), the workflow's
call, the activity method and the controller function it calls: nothing else names it.
"""

from __future__ import annotations

from enum import StrEnum

from turnkeep.schemas.names import controller_queue, policy_queue, trainer_queue


class Runs(StrEnum):
    """Where a step's activity runs."""

    CONTROLLER = "controller"
    """On the controller's task queue, in the controller's process."""
    LOCAL = "local"
    """A local activity of the controller's workflow worker (no queue round trip); the controller also serves it on
    its queue, for histories recorded before it ran locally."""
    TRAINER = "trainer"
    """On the trainer's task queue, in the trainer's process: it changes the trainer's own state."""
    POLICY = "policy"
    """On one policy engine's task queue (`<run_id>.policy.<k>`), in its process."""


STEPS: dict[str, Step] = {}
"""Every declared step by name, filled as the modules that declare them are imported (`schemas.step_registry`
imports them all)."""


class Step(str):
    """An activity's name, with its input and result models and where it runs."""

    input: type
    result: type
    runs: Runs

    def __new__(cls, name: str, input: type, result: type, runs: Runs) -> Step:
        if name in STEPS:
            raise ValueError(f"step {name!r} is declared twice")
        step = super().__new__(cls, name)
        step.input, step.result, step.runs = input, result, runs
        STEPS[name] = step
        return step

    def task_queue(self, run_id: str, engine: int | None = None) -> str | None:
        """The queue to schedule it on; None for the controller's own (the workflows' queue), and for a local one.
        `engine`: which policy engine runs a policy step (None: the queue of a history from before engines)."""
        if self.runs is Runs.TRAINER:
            return trainer_queue(run_id)
        if self.runs is Runs.POLICY:
            return policy_queue(run_id, engine)
        return None

    def queue_of_worker(self, run_id: str, engine: int | None = None) -> str:
        """The queue of the worker that implements it."""
        return self.task_queue(run_id, engine) or controller_queue(run_id)
