"""The judge environment: calc per sibling, rewards from a pairwise judge over the whole group."""

import asyncio

import pytest

from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.judge_env import JudgeEnvironment
from turnkeep.schemas.rollout import Problem

PROBLEM = Problem(question="Q 37+48-12", answer=73, env="judge")
PERFECT = ["C 37+48\n", "C 85-12\n", "A 73\n"]
WRONG = ["C 37+48\n", "C 85-12\n", "A 74\n"]


def test_each_sibling_plays_plain_calc() -> None:
    async def main() -> None:
        for turns, reward in ((PERFECT, 1.0), (WRONG, 0.0)):
            judge, calc = JudgeEnvironment(PROBLEM), CalcEnvironment(PROBLEM)
            assert judge.prompt() == calc.prompt()
            assert await judge.replay(turns) == await calc.replay(turns)
            assert judge.reward() == calc.reward() == reward

    asyncio.run(main())
    assert (JudgeEnvironment.kind, JudgeEnvironment.recovery_mode, JudgeEnvironment.group_scored) == (
        "judge",
        "stateless",
        True,
    )


def test_mixed_group_is_ranked_pairwise() -> None:
    # calc's score is all-or-nothing on the exact chain, so every correct sibling of a problem
    # takes the same number of turns; turn counts only separate siblings with equal scores.
    extra_call = ["C 37+48\n", "C 85-12\n", "C 73+0\n", "A 73\n"]  # score 0 in 4 turns
    skipped = ["A 73\n"]  # score 0 in 1 turn
    group = [PERFECT, extra_call, skipped]
    # PERFECT beats both; skipped beats extra_call on fewer turns; extra_call beats nobody.
    rewards = JudgeEnvironment.score_group(PROBLEM, group)
    assert rewards == [1.0, 0.0, 0.5]
    n = len(group)
    assert sum(r * (n - 1) for r in rewards) == pytest.approx(n * (n - 1) / 2)


def test_full_ties_count_half_a_win() -> None:
    group = [PERFECT, PERFECT, WRONG, ["A 73\n"]]  # two 1.0/3-turn, one 0.0/3-turn, one 0.0/1-turn
    rewards = JudgeEnvironment.score_group(PROBLEM, group)
    assert rewards == pytest.approx([2.5 / 3, 2.5 / 3, 0.0, 1 / 3])
    n = len(group)
    assert sum(r * (n - 1) for r in rewards) == pytest.approx(n * (n - 1) / 2)


def test_rewards_depend_on_the_whole_group() -> None:
    # The same sibling gets a different reward when only its siblings change.
    assert JudgeEnvironment.score_group(PROBLEM, [WRONG, ["A 73\n"]])[0] == 0.0
    assert JudgeEnvironment.score_group(PROBLEM, [WRONG, WRONG + ["C 1+1\n"]])[0] == 1.0


def test_all_equal_siblings_get_one_half() -> None:
    for turns in (PERFECT, WRONG):
        assert JudgeEnvironment.score_group(PROBLEM, [turns] * 4) == [0.5] * 4


def test_a_group_needs_two_siblings() -> None:
    for group in ([], [PERFECT]):
        with pytest.raises(ValueError, match="at least 2 siblings"):
            JudgeEnvironment.score_group(PROBLEM, group)
