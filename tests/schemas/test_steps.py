"""Every step of the workflows is declared once, beside its models, and implemented exactly once by the activity
classes of the process it runs in; the workers register what those classes define, checked against the steps."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from temporalio import activity

from turnkeep.activities.engine_activities import EngineActivities
from turnkeep.activities.env_server_activities import EnvServerActivities
from turnkeep.activities.eval_activities import EvalActivities
from turnkeep.activities.policy_activities import PolicyActivities
from turnkeep.activities.recovery_activities import RecoveryActivities
from turnkeep.activities.snapshot_activities import SnapshotActivities
from turnkeep.activities.trainer_activities import TrainerActivities
from turnkeep.primitives.temporal_client import StepImplementationError, activity_name, step_activities
from turnkeep.schemas.attempt_steps import GYM_MARK, GymInput, GymMarkResult
from turnkeep.schemas.step_registry import declared_steps
from turnkeep.schemas.steps import Runs, Step

PROCESS_CLASSES = {
    Runs.CONTROLLER: (EnvServerActivities, SnapshotActivities, RecoveryActivities, EngineActivities),
    Runs.LOCAL: (EnvServerActivities, SnapshotActivities, EvalActivities),
    Runs.TRAINER: (TrainerActivities,),
    Runs.POLICY: (PolicyActivities,),
}


def _implemented(classes) -> list[str]:
    return [name for cls in classes for _, fn in inspect.getmembers(cls, inspect.isfunction)
            if (name := activity_name(fn)) is not None]


def test_every_step_is_implemented_exactly_once_where_it_runs():
    steps = declared_steps()
    assert len(steps) == 26  # every activity a history of this project names
    for runs, classes in PROCESS_CLASSES.items():
        implemented = _implemented(classes)
        wanted = sorted(name for name, step in steps.items() if step.runs is runs)
        assert sorted(name for name in implemented if steps[name].runs is runs) == wanted, runs
        assert len(implemented) == len(set(implemented)), f"a step implemented twice on the {runs} worker"


def test_a_step_is_its_name_for_temporal_and_knows_its_queue():
    assert GYM_MARK == "gym.mark" and isinstance(GYM_MARK, str) and f"{GYM_MARK}" == "gym.mark"
    assert GYM_MARK.input is GymInput and GYM_MARK.result is GymMarkResult and GYM_MARK.task_queue("r") is None
    steps = declared_steps()
    assert steps["trainer.hold"].task_queue("r") == "r.trainer"
    assert steps["policy.load_weights"].queue_of_worker("r") == "r.policy"  # a history from before engines
    assert steps["policy.load_weights"].queue_of_worker("r", engine=2) == "r.policy.2"
    assert steps["gym.prepare"].queue_of_worker("r") == "r.controller"
    with pytest.raises(ValueError, match="declared twice"):
        Step("gym.mark", GymInput, GymMarkResult, Runs.LOCAL)


def test_a_worker_registers_what_the_class_defines_and_refuses_a_mismatch():
    class Marks:
        @activity.defn(name="gym.mark")
        async def mark(self, inp: GymInput) -> GymMarkResult:
            raise NotImplementedError

        def helper(self) -> None:
            """Not an activity: not registered."""

    assert [activity_name(fn) for fn in step_activities(Marks(), runs=[Runs.LOCAL])] == ["gym.mark"]
    with pytest.raises(StepImplementationError, match="runs on the local worker, this one serves trainer"):
        step_activities(Marks(), runs=[Runs.TRAINER])

    class WrongResult:
        @activity.defn(name="gym.mark")
        async def mark(self, inp: GymInput) -> SimpleNamespace:
            raise NotImplementedError

    with pytest.raises(StepImplementationError, match="returns SimpleNamespace; its step takes GymInput and returns "
                                                      "GymMarkResult"):
        step_activities(WrongResult(), runs=[Runs.LOCAL])

    class Undeclared:
        @activity.defn(name="gym.dance")
        async def dance(self, inp: GymInput) -> GymMarkResult:
            raise NotImplementedError

    with pytest.raises(StepImplementationError, match="implements no declared step"):
        step_activities(Undeclared(), runs=[Runs.LOCAL])
