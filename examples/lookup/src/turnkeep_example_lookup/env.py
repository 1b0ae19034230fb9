"""Key-value lookups: the agent must ask a tool for facts it cannot know, then answer.

Every problem has a hidden table of single-letter keys and one-digit values (it travels
in the prompt's record, `problem.metadata["table"]`, and is never shown). The question
names some of its keys; the answer is their values, in the question's order:

    K ca        prompt: the values of keys c and a, please
    L c         policy: look up key c
    V 7         tool: its value ("V ?" for a key the table does not hold, or a malformed turn's text)
    L a         policy: look up key a
    V 3
    A 73        policy: the answer, ends the episode

The reward is 1.0 only for exactly the lookups the question asks for, in its order, then
the right answer; anything else scores 0.0 (a guessed value, an extra or a missed lookup,
a wrong digit). A turn that is neither a lookup nor an answer ends the episode.

The tool is a pure function of the table and the turn, so the environment is stateless:
replaying the saved turns on a fresh instance gives back the same observations.

`demonstrations` writes whole conversations for the warm start of turnkeep's made-up
tiny model: a share (`demo_error_rate`) holds one deliberate mistake each, so the model
starts often wrong and RL has something to learn.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnkeep import EnvContext, Environment, Problem, StepResult

KEYS = "abcdefgh"
"""Every key a table may hold (a table holds at most 7 of them, so a key it lacks always exists)."""
DIGITS = "0123456789"
UNKNOWN = "V ?\n"
"""The tool's reply to a key the table does not hold."""
MISTAKES = ("key", "answer", "early", "unknown")
"""Deliberate mistakes in demonstrations: a wrong key looked up (its value then used), a wrong answer digit,
an answer that skips the last lookup and guesses its value, a lookup of a key the table lacks first."""

_LOOKUP_RE = re.compile(r"L ([a-z])\n?")
_ANSWER_RE = re.compile(r"A (\d{1,8})\n?")
_QUESTION_RE = re.compile(r"K ([a-h]{1,7})\n?")


class LookupOptions(BaseModel):
    """`[environments.<name>] options`: the shape of problems and the demonstrations' share of mistakes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys_per_question: int = Field(default=2, ge=1, le=4)
    """Keys a question asks for: the episode has that many lookups, then the answer."""
    table_size: int = Field(default=5, ge=1, le=7)
    """Keys in a problem's hidden table (the ones not asked for are distractors)."""
    demo_error_rate: float = Field(default=0.6, ge=0.0, le=1.0)
    """Share of demonstrations with one deliberate mistake (so the warm-started model starts often wrong)."""

    @model_validator(mode="after")
    def _table_holds_the_question(self) -> "LookupOptions":
        if self.table_size < self.keys_per_question:
            raise ValueError(f"table_size ({self.table_size}) must be at least keys_per_question "
                             f"({self.keys_per_question})")
        return self


@dataclass(frozen=True)
class Lookup:
    key: str

    def text(self) -> str:
        return f"L {self.key}\n"


@dataclass(frozen=True)
class Answer:
    value: str

    def text(self) -> str:
        return f"A {self.value}\n"


@dataclass(frozen=True)
class Malformed:
    text: str


Action = Lookup | Answer | Malformed


def parse_action(text: str) -> Action:
    """One policy turn; its trailing newline is optional (a turn cut at the token limit has none)."""
    if m := _LOOKUP_RE.fullmatch(text):
        return Lookup(m.group(1))
    if m := _ANSWER_RE.fullmatch(text):
        return Answer(m.group(1))
    return Malformed(text)


def tool_reply(table: dict[str, int], key: str) -> str:
    """The lookup tool: `V <digit>` for a key of the table, `V ?` otherwise."""
    return f"V {table[key]}\n" if key in table else UNKNOWN


def sample_problem(rng: random.Random, options: LookupOptions = LookupOptions()) -> Problem:
    """A random table and a question about `keys_per_question` of its keys (env name "lookup")."""
    keys = rng.sample(KEYS, options.table_size)
    table = {key: rng.randrange(10) for key in sorted(keys)}
    asked = rng.sample(keys, options.keys_per_question)
    answer = "".join(str(table[key]) for key in asked)
    return Problem(question="K " + "".join(asked), answer=answer, env="lookup", metadata={"table": table})


def problem_table(problem: Problem) -> dict[str, int]:
    """The hidden table of `problem`, checked (it comes from a prompts file)."""
    table = problem.metadata.get("table")
    if not isinstance(table, dict) or not table:
        raise ValueError(f"lookup problem {problem.question!r}: metadata has no table; give the record a "
                         '"table" field such as {"a": 7, "c": 3}')
    for key, value in table.items():
        if key not in KEYS or not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 9:
            raise ValueError(f"lookup problem {problem.question!r}: table entry {key!r}: {value!r} is not a key "
                             f"of {KEYS!r} with a value 0..9")
    if len(table) >= len(KEYS):
        raise ValueError(f"lookup problem {problem.question!r}: a table holds at most {len(KEYS) - 1} keys")
    return dict(table)


def asked_keys(problem: Problem, table: dict[str, int]) -> list[str]:
    """The keys the question asks for, checked against the table."""
    m = _QUESTION_RE.fullmatch(problem.question)
    if m is None:
        raise ValueError(f"not a lookup question: {problem.question!r} (expected \"K \" and one to seven keys)")
    missing = [key for key in m.group(1) if key not in table]
    if missing:
        raise ValueError(f"lookup problem {problem.question!r}: the table lacks {''.join(missing)!r}")
    return list(m.group(1))


def expected_answer(problem: Problem) -> str:
    table = problem_table(problem)
    return "".join(str(table[key]) for key in asked_keys(problem, table))


def score(problem: Problem, turns: list[str]) -> float:
    """1.0 for exactly the asked lookups in order, then the right answer; else 0.0."""
    table = problem_table(problem)
    expected = [Lookup(key) for key in asked_keys(problem, table)]
    actions = [parse_action(turn) for turn in turns]
    if not actions or actions[:-1] != expected or not isinstance(actions[-1], Answer):
        return 0.0
    return float(actions[-1].value == expected_answer(problem))


def conversation(problem: Problem, rng: random.Random, error_rate: float) -> str:
    """A whole conversation in the line protocol: correct, or with one deliberate mistake (scoring 0)."""
    table = problem_table(problem)
    keys = asked_keys(problem, table)
    mistake = rng.choice(MISTAKES) if rng.random() < error_rate else None
    if mistake == "key" and len(table) == 1:
        mistake = "answer"
    lookups = list(keys)
    if mistake == "key":
        i = rng.randrange(len(lookups))
        lookups[i] = rng.choice([key for key in table if key != lookups[i]])
    if mistake == "unknown":
        lookups.insert(0, rng.choice([key for key in KEYS if key not in table]))
    if mistake == "early":
        lookups.pop()
    lines = [problem.question + "\n"]
    for key in lookups:
        lines += [Lookup(key).text(), tool_reply(table, key)]
    values = [str(table[key]) for key in lookups if key in table]
    if mistake == "early":
        values.append(rng.choice(DIGITS))  # a guess for the key it did not look up
    if mistake == "answer":
        i = rng.randrange(len(values))
        values[i] = rng.choice([d for d in DIGITS if d != values[i]])
    return "".join(lines) + Answer("".join(values)).text()


class LookupEnvironment(Environment):
    """Stateless: the tool's replies follow from the table and the turns, so a replay rebuilds an episode."""

    kind = "lookup"
    recovery_mode = "stateless"
    Options = LookupOptions

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        self._problem = problem
        self._table = problem_table(problem)
        asked_keys(problem, self._table)  # refuse a broken record now, not at the reward
        if problem.answer is not None and str(problem.answer) != expected_answer(problem):
            raise ValueError(f"lookup problem {problem.question!r}: answer {problem.answer!r} disagrees with its "
                             f"table ({expected_answer(problem)!r}); fix or drop the record's answer")
        self._tool_latency_s = ctx.tool_latency_s
        self._turns: list[str] = []

    def prompt(self) -> str:
        return self._problem.question + "\n"

    async def step(self, turn_text: str) -> StepResult:
        self._turns.append(turn_text)
        action = parse_action(turn_text)
        if isinstance(action, Lookup):
            if self._tool_latency_s:
                await asyncio.sleep(self._tool_latency_s)
            return StepResult(observation=tool_reply(self._table, action.key), done=False)
        return StepResult(observation=None, done=True)

    def reward(self) -> float:
        return score(self._problem, self._turns)

    @classmethod
    def demonstrations(cls, rng: random.Random, count: int, options: BaseModel) -> list[str]:
        opts = options if isinstance(options, LookupOptions) else LookupOptions.model_validate(options.model_dump())
        return [conversation(sample_problem(rng, opts), rng, opts.demo_error_rate) for _ in range(count)]
