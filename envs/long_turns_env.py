"""The calculator task with long turns: every policy turn first writes out a long scratch line.

A turn is `S <scratch> <action>`: the scratch restates the question's expression again and
again, to at least `scratch_length` characters (one token each with the tiny model's
tokenizer), then comes the calculator call or the answer of the default task:

    Q 37+48-12
    S 37+48-12 37+48-12 ... 37+48-12 C 37+48      policy: a long turn, ending in a tool call
    R 85                                          tool
    S 37+48-12 37+48-12 ... 37+48-12 C 85-12
    R 73
    S 37+48-12 37+48-12 ... 37+48-12 A 73         policy: the answer, ends the episode

So a turn is a hundred tokens and more, like a reasoning model's, and a crash mid-turn loses
real work: the environment to measure the `token` level on (`configs/long_turns.toml`).
Restating the question keeps what each action needs close to it, which a made-up model of
two layers can learn to copy. The scratch is not scored (anything without a `C` or an `A`
will do); the reward is the calculator task's, all or nothing. Stateless, like the
calculator: a replay of the saved turns rebuilds an episode. Its demonstrations warm-start
the made-up tiny model (`[model.tiny] demonstrations`).
"""

from __future__ import annotations

import random
import re

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.calc_task import sample_problem, synthetic_transcript
from turnkeep.envs.environment import StepResult
from turnkeep.schemas.config import TaskConfig

SCRATCH_TAG = "S "
_TURN_RE = re.compile(r"S [^CA\n]*([CA] [^\n]*\n?)")


class LongTurnsOptions(BaseModel):
    """`[environments.<name>] options`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scratch_length: int = Field(default=128, ge=1, le=4096)
    """Characters of scratch (at least; whole restatements) the demonstrations write before each action: about the
    length of a turn in the tiny model's tokens."""
    demo_error_rate: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of demonstrations with one deliberate mistake (the calculator's), so RL has something to learn."""
    num_operands: int = Field(default=3, ge=2, le=6)
    max_operand: int = Field(default=99, ge=2)
    operators: str = "+-"
    """The demonstrations' problems; keep them as `[task]`'s, which the run's prompts come from."""


def scratch(question: str, length: int) -> str:
    """The question's expression restated, space-separated, to at least `length` characters."""
    expression = question.removeprefix("Q ").strip()
    times = -(-(length + 1) // (len(expression) + 1))
    return " ".join([expression] * times)


def action_of(turn: str) -> str:
    """The action a long turn ends in (`C a+b` or `A n`); a turn without a scratch line is taken as it is."""
    m = _TURN_RE.fullmatch(turn)
    return m.group(1) if m else turn


def lengthen(transcript: str, length: int) -> str:
    """A calculator transcript with every policy line written as a long turn."""
    lines = transcript.splitlines(keepends=True)
    pad = scratch(lines[0], length)
    return "".join(f"{SCRATCH_TAG}{pad} {line}" if line.startswith(("C ", "A ")) else line for line in lines)


class LongTurnsEnvironment(CalcEnvironment):
    """The calculator, stepped with each long turn's action: stateless, as it is."""

    kind = "long_turns"
    Options = LongTurnsOptions

    async def step(self, turn_text: str) -> StepResult:
        return await super().step(action_of(turn_text))

    @classmethod
    def demonstrations(cls, rng: random.Random, count: int, options: BaseModel) -> list[str]:
        opts = LongTurnsOptions.model_validate(options.model_dump())
        task = TaskConfig(num_operands=opts.num_operands, max_operand=opts.max_operand, operators=opts.operators)
        return [lengthen(synthetic_transcript(sample_problem(task, rng), rng, opts.demo_error_rate),
                         opts.scratch_length) for _ in range(count)]
