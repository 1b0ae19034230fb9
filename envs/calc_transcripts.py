"""The default task's conversations for the made-up tiny model (a transcript source, handed to its maker).

Generated calculator questions written out by `calc_task.synthetic_transcript`, a share of
them deliberately wrong (`[model.tiny] warm_start_error_rate`), with the same random draws,
alphabet and cache key as every model made so far. Policy lines are told by their tag
("C ...", "A ..."). `CalcEpisodes` plays the calculator turn by turn, so the maker can
measure the warm-started model's starting reward. Pure python: no torch here.
"""

from __future__ import annotations

import random
from typing import Any

from turnkeep.envs.calc_task import (
    ALPHABET,
    FinalAnswer,
    parse_action,
    run_tool,
    sample_problem,
    score,
    synthetic_transcript,
)
from turnkeep.envs.codec import LINE_TEMPLATE
from turnkeep.schemas.config import TaskConfig
from turnkeep.schemas.rollout import Problem

CALC_EXTRA_LINES = ["R ERR\n"] * 8
"""Lines the calculator's transcripts never contain but its environment sends."""
CALC_POLICY_TAGS = ("C", "A")
"""Calculator lines the policy writes (trained on); the rest is context."""


class CalcEpisodes:
    """`[task]`'s problems, played against the calculator and scored all-or-nothing."""

    def __init__(self, task: TaskConfig) -> None:
        self.task = task

    def prompts(self, rng: random.Random, count: int) -> list[tuple[str, Problem]]:
        problems = [sample_problem(self.task, rng) for _ in range(count)]
        return [(problem.question, problem) for problem in problems]

    def reply(self, turn: str) -> str | None:
        action = parse_action(turn)
        return None if isinstance(action, FinalAnswer) else run_tool(action)

    def score(self, problem: Problem, turns: list[str]) -> float:
        return score(problem, turns)


class CalcTranscripts:
    """The generated calculator transcripts, `[task]`'s problems with `error_rate` deliberate mistakes."""

    name = "calc"
    chat_template = LINE_TEMPLATE
    added_tokens: tuple[str, ...] = ()
    error_rate_applies = True

    def __init__(self, task: TaskConfig) -> None:
        self.task = task
        self.episodes = CalcEpisodes(task)

    def tokenizer_corpus(self, seed: int, count: int) -> list[str]:
        rng = random.Random(f"turnkeep-tokenizer-{seed}")
        return self.batch(rng, count, 0.5) + CALC_EXTRA_LINES

    def alphabet(self, seed: int) -> str:
        return ALPHABET

    def batch(self, rng: random.Random, count: int, error_rate: float) -> list[str]:
        # One problem then its transcript, in turn: the draws (and so the bytes) of every model made so far.
        return [synthetic_transcript(sample_problem(self.task, rng), rng, error_rate) for _ in range(count)]

    def is_policy_line(self, index: int, line: str) -> bool:
        return line.startswith(CALC_POLICY_TAGS)

    def recipe(self, seed: int) -> dict[str, Any]:
        return {"task": self.task.model_dump(mode="json")}

    def check_covered(self, texts: list[str], seed: int) -> None:
        """Every character of a calculator transcript is in ALPHABET."""
