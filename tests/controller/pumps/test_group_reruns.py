"""A live failure of one sibling on the real stack (controller, environment server, vLLM,
trainer, Temporal), per environment kind and level: the environment server's tool crashes
for the next rollouts, and the group recovers as its level says."""

from __future__ import annotations

import asyncio

import pytest

from tests.workflows.snapshot_harness import run_scenario, scenario_config
from turnkeep.schemas.participant import FaultPlan

pytestmark = pytest.mark.integration


def _run(stack, stack_config, temporal_address, env: str, kind: str, level: str):
    cfg = scenario_config(stack_config).model_copy(update={
        "environments": {env: stack_config.environments["calc"].model_copy(update={"kind": kind})},
        "rollout_recovery": stack_config.rollout_recovery.model_copy(update={"target_level": level}),
    })
    result = asyncio.run(run_scenario(stack, temporal_address, cfg, steps=3,
                                      env_faults=FaultPlan(crash_rollouts={env: 2})))
    return result.step_lines


def test_a_crash_in_a_group_scored_environment_reruns_the_group_and_the_judge_scores_it(
    stack, stack_config, temporal_address,
) -> None:
    steps = _run(stack, stack_config, temporal_address, "judge", "judge", "turn")
    counts = steps[-1]["recovery_by_env_total"]["judge"]
    assert counts["groups_retried_whole"] >= 1  # two crashes of one round rerun the group once
    assert steps[-1]["retries_total"] == 0 and steps[-1]["siblings_dropped_total"] == {}
    # Every trained group was scored by the pairwise judge, whose rewards add up to N/2 per group.
    assert all(line["reward_mean"] == pytest.approx(0.5) for line in steps)


def test_a_crash_at_the_prompt_group_level_reruns_the_whole_group(stack, stack_config, temporal_address) -> None:
    steps = _run(stack, stack_config, temporal_address, "calc", "calc", "prompt_group")
    counts = steps[-1]["recovery_by_env_total"]["calc"]
    assert counts["groups_rerun_whole"] >= 1 and "groups_retried_whole" not in counts
    assert steps[-1]["retries_total"] == 0


@pytest.mark.parametrize("kind", ["workspace", "lab"])
def test_a_crash_at_the_turn_level_retries_only_that_sibling(stack, stack_config, temporal_address, kind) -> None:
    steps = _run(stack, stack_config, temporal_address, kind, kind, "turn")
    counts = steps[-1]["recovery_by_env_total"][kind]
    assert counts == {"rerun_from_scratch": 2}
    assert steps[-1]["retries_total"] == 2
