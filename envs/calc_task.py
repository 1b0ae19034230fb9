"""The default task: multi-turn arithmetic where every operation goes through a calculator.

A conversation is plain text, one turn per line, every line ending in "\\n":

    Q 37+48-12      prompt: `num_operands` operands, evaluated left to right
    C 37+48         policy: calculator call (exactly one binary operation)
    R 85            tool result ("R ERR" for a malformed call)
    C 85-12         policy: the next call chains on the previous result
    R 73
    A 73            policy: final answer, ends the rollout

The reward is all-or-nothing: 1.0 only when the agent made exactly the expected chain
of calls and then answered the right number. Requiring the chain (not just the answer)
keeps the task about tool use: an agent that guesses or skips the calculator gets 0.

`synthetic_transcript` writes correct conversations, or deliberately imperfect ones, for
the supervised warm start of the made-up model: RL then starts from a policy that
follows the format but is often wrong, so there is something left to learn.

Pure python on purpose: the environment server imports it without torch.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from turnkeep.schemas.config import TaskConfig
from turnkeep.schemas.rollout import Problem, PromptRecord

SUPPORTED_OPERATORS = "+-*"
ALPHABET = "0123456789+-*/ \nQCRAE"
"""Every character of the task's text, plus "/" reserved (the tokenizer's base alphabet)."""
MISTAKES = ("operand", "answer", "early")
"""Kinds of deliberate mistakes in imperfect warm-start transcripts."""

_NUMBER = r"-?\d{1,12}"
_CALL_RE = re.compile(rf"C ({_NUMBER})([+\-*])({_NUMBER})\n?")
_ANSWER_RE = re.compile(rf"A ({_NUMBER})\n?")
_QUESTION_TERM_RE = re.compile(r"([+\-*])(\d+)")


@dataclass(frozen=True)
class CalcCall:
    """A calculator call `a op b`."""

    a: int
    op: str
    b: int

    def text(self) -> str:
        return f"C {self.a}{self.op}{self.b}\n"


@dataclass(frozen=True)
class FinalAnswer:
    """The agent's answer; ends the rollout."""

    value: int

    def text(self) -> str:
        return f"A {self.value}\n"


@dataclass(frozen=True)
class Malformed:
    """A turn that is neither a call nor an answer (kept for logs)."""

    text: str


Action = CalcCall | FinalAnswer | Malformed


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unsupported operator {op!r} (supported: {SUPPORTED_OPERATORS!r})")


def sample_problem(cfg: TaskConfig, rng: random.Random) -> Problem:
    """A question with `cfg.num_operands` operands in 1..max_operand, evaluated left to right."""
    bad = set(cfg.operators) - set(SUPPORTED_OPERATORS)
    if bad or not cfg.operators:
        raise ValueError(
            f"task.operators={cfg.operators!r}: use a non-empty subset of {SUPPORTED_OPERATORS!r}"
        )
    operands = [rng.randint(1, cfg.max_operand) for _ in range(cfg.num_operands)]
    ops = [rng.choice(cfg.operators) for _ in range(cfg.num_operands - 1)]
    question = "Q " + str(operands[0]) + "".join(f"{o}{n}" for o, n in zip(ops, operands[1:]))
    return Problem(question=question, answer=_evaluate(operands, ops))


class CalcProblems:
    """The default task as a prompt source (`controller.state.prompt_sources`): problem i of an endless sequence,
    drawn from (seed, i) alone."""

    path = None
    digest = None
    size = None

    def __init__(self, task: TaskConfig, seed: int) -> None:
        self._task = task
        self._seed = seed

    def record(self, position: int) -> PromptRecord:
        problem = sample_problem(self._task, random.Random(f"{self._seed}:{position}"))
        return PromptRecord(prompt=problem.question, answer=problem.answer)


def parse_question(question: str) -> tuple[list[int], list[str]]:
    """Operands and operators of a `Q 37+48-12` question."""
    body = question.removeprefix("Q ").rstrip("\n")
    first = re.match(r"\d+", body)
    if first is None:
        raise ValueError(f"not a calc question: {question!r}")
    terms = _QUESTION_TERM_RE.findall(body[first.end() :])
    return [int(first.group())] + [int(n) for _, n in terms], [o for o, _ in terms]


def expected_calls(problem: Problem) -> list[CalcCall]:
    """The chain of calls a perfect agent makes: each starts from the previous result."""
    operands, ops = parse_question(problem.question)
    calls, acc = [], operands[0]
    for op, b in zip(ops, operands[1:]):
        calls.append(CalcCall(acc, op, b))
        acc = apply_op(acc, op, b)
    return calls


def parse_action(text: str) -> Action:
    """Parse one policy turn; the trailing newline is optional (a truncated turn has none)."""
    if m := _CALL_RE.fullmatch(text):
        return CalcCall(int(m.group(1)), m.group(2), int(m.group(3)))
    if m := _ANSWER_RE.fullmatch(text):
        return FinalAnswer(int(m.group(1)))
    return Malformed(text)


def run_tool(action: CalcCall | Malformed) -> str:
    """The calculator's reply line to a call: `R <result>\\n`, or `R ERR\\n` if malformed."""
    if isinstance(action, CalcCall):
        return f"R {apply_op(action.a, action.op, action.b)}\n"
    return "R ERR\n"


def score(problem: Problem, turns: list[str]) -> float:
    """Reward of a rollout from its policy turns only (tool replies follow from the calls).

    1.0 when the turns are exactly the expected calls followed by the right answer;
    0.0 otherwise: a malformed turn, a missing/extra/wrong call, no final answer, or a
    wrong one.
    """
    actions = [parse_action(t) for t in turns]
    if not actions or not isinstance(actions[-1], FinalAnswer):
        return 0.0
    if actions[:-1] != expected_calls(problem):
        return 0.0
    return float(actions[-1].value == problem.answer)


def synthetic_transcript(problem: Problem, rng: random.Random, error_rate: float) -> str:
    """A whole conversation (question, calls, tool replies, answer) for supervised training.

    With probability `error_rate` it holds exactly one deliberate mistake, each of which
    scores 0: a wrongly copied operand (the chain then continues consistently from the
    wrong result), a wrong final answer, or an early answer that skips the last call.
    """
    calls = expected_calls(problem)
    mistake = rng.choice(MISTAKES) if rng.random() < error_rate else None
    if mistake == "operand":
        calls = _with_wrong_operand(calls, rng)
    elif mistake == "early":
        calls = calls[:-1]
    lines = [problem.question + "\n"]
    for call in calls:
        lines += [call.text(), run_tool(call)]
    answer = _result(calls[-1]) if calls else parse_question(problem.question)[0][0]
    if mistake == "answer":
        answer = _wrong_number(answer, rng)
    return "".join(lines) + FinalAnswer(answer).text()


def _with_wrong_operand(calls: list[CalcCall], rng: random.Random) -> list[CalcCall]:
    i = rng.randrange(len(calls))
    call = calls[i]
    if rng.random() < 0.5:
        call = CalcCall(_wrong_number(call.a, rng), call.op, call.b)
    else:
        call = CalcCall(call.a, call.op, _wrong_number(call.b, rng))
    out = calls[:i] + [call]
    for later in calls[i + 1 :]:
        # The agent copies the (wrong) result it was shown, like a real copying slip.
        out.append(CalcCall(_result(out[-1]), later.op, later.b))
    return out


def _wrong_number(n: int, rng: random.Random) -> int:
    """A plausible slip: one digit changed, or off by a little; never equal to `n`."""
    if rng.random() < 0.5:
        digits = list(str(abs(n)))
        k = rng.randrange(len(digits))
        digits[k] = rng.choice([d for d in "0123456789" if d != digits[k]])
        wrong = int("".join(digits)) * (-1 if n < 0 else 1)
        if wrong != n:
            return wrong
    return n + rng.choice((-1, 1)) * rng.randint(1, 10)


def _result(call: CalcCall) -> int:
    return apply_op(call.a, call.op, call.b)


def _evaluate(operands: list[int], ops: list[str]) -> int:
    acc = operands[0]
    for op, b in zip(ops, operands[1:]):
        acc = apply_op(acc, op, b)
    return acc
