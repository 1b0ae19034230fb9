"""The long-turn calculator: demonstrations whose every policy turn is a long scratch line before the calculator
task's action, and an environment that plays and scores those turns as the calculator does."""

import asyncio
import random

from turnkeep.envs.calc_task import parse_action, run_tool
from turnkeep.envs.long_turns_env import LongTurnsEnvironment, LongTurnsOptions, action_of, scratch
from turnkeep.schemas.rollout import Problem

PROBLEM = Problem(question="Q 37+48-12", answer=73)


def test_every_policy_turn_of_a_demonstration_is_a_long_scratch_then_an_action():
    options = LongTurnsOptions(scratch_length=128, demo_error_rate=0.0)
    for text in LongTurnsEnvironment.demonstrations(random.Random(3), 20, options):
        lines = text.splitlines(keepends=True)
        assert lines[0].startswith("Q ") and len(lines) % 2 == 0
        expression = lines[0][2:-1]
        for turn, reply in zip(lines[1::2], lines[2::2] + [None], strict=True):
            assert turn.startswith("S ")
            pad, action = turn[2:].rsplit(" ", 2)[0], " ".join(turn[2:].rsplit(" ", 2)[1:])
            assert pad == scratch(lines[0], 128) and 128 <= len(pad) < 128 + len(expression) + 1
            assert set(pad.split(" ")) == {expression}
            assert reply is None or reply == run_tool(parse_action(action))


def test_the_environment_plays_and_scores_long_turns_like_the_calculator():
    async def episode(turns: list[str]) -> tuple[list, float]:
        env = LongTurnsEnvironment(PROBLEM)
        replies = [(await env.step(turn)).observation for turn in turns]
        return replies, env.reward()

    pad = scratch(PROBLEM.question, 40)
    right = [f"S {pad} C 37+48\n", f"S {pad} C 85-12\n", f"S {pad} A 73\n"]
    assert asyncio.run(episode(right)) == (["R 85\n", "R 73\n", None], 1.0)
    assert asyncio.run(episode(right[:2] + [f"S {pad} A 74\n"]))[1] == 0.0
    # Any digits make a scratch; a turn that never reaches its action ends the episode unscored.
    assert action_of("S 9+9 99 C 1+2\n") == "C 1+2\n"
    assert asyncio.run(episode(["S 37+48-12 37+48"])) == ([None], 0.0)
    assert asyncio.run(LongTurnsEnvironment(PROBLEM).replay(right)) == ["R 85\n", "R 73\n", None]
