"""The calc task: problems, parsing, the calculator, scoring and synthetic transcripts."""

import random

import pytest

from turnkeep.envs.calc_task import (
    CalcCall,
    FinalAnswer,
    Malformed,
    expected_calls,
    parse_action,
    parse_question,
    run_tool,
    sample_problem,
    score,
    synthetic_transcript,
)
from turnkeep.schemas.config import TaskConfig
from turnkeep.schemas.rollout import Problem

PROBLEM = Problem(question="Q 37+48-12", answer=73)
PERFECT = ["C 37+48\n", "C 85-12\n", "A 73\n"]


def _policy_turns(transcript: str) -> list[str]:
    return [line for line in transcript.splitlines(keepends=True) if line.startswith(("C", "A"))]


def test_sampling_is_deterministic_and_follows_the_config() -> None:
    cfg = TaskConfig(num_operands=4, max_operand=9, operators="+*")
    first = [sample_problem(cfg, random.Random(7)) for _ in range(3)]
    assert first == [sample_problem(cfg, random.Random(7)) for _ in range(3)]
    operands, ops = parse_question(first[0].question)
    assert len(operands) == 4 and all(1 <= n <= 9 for n in operands)
    assert set(ops) <= {"+", "*"}


def test_answer_is_evaluated_left_to_right() -> None:
    chain = expected_calls(Problem(question="Q 2+3*4", answer=20))
    assert chain == [CalcCall(2, "+", 3), CalcCall(5, "*", 4)]
    rng = random.Random(0)
    for _ in range(20):
        problem = sample_problem(TaskConfig(operators="+-*"), rng)
        turns = [call.text() for call in expected_calls(problem)] + [f"A {problem.answer}\n"]
        assert score(problem, turns) == 1.0


def test_unsupported_operator_is_refused() -> None:
    with pytest.raises(ValueError, match="operators"):
        sample_problem(TaskConfig(operators="+/"), random.Random(0))


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("C 37+48\n", CalcCall(37, "+", 48)),
        ("C -5-12", CalcCall(-5, "-", 12)),
        ("C 3*-2\n", CalcCall(3, "*", -2)),
        ("A -73\n", FinalAnswer(-73)),
        ("A 73", FinalAnswer(73)),
        ("C 37 + 48\n", Malformed("C 37 + 48\n")),
        ("C 37+48+1\n", Malformed("C 37+48+1\n")),
        ("A 7 3\n", Malformed("A 7 3\n")),
        ("R 85\n", Malformed("R 85\n")),
        ("", Malformed("")),
        ("C 1+2\n\n", Malformed("C 1+2\n\n")),
    ],
)
def test_parse_action(text: str, action: object) -> None:
    assert parse_action(text) == action


def test_calculator_replies() -> None:
    assert run_tool(CalcCall(37, "+", 48)) == "R 85\n"
    assert run_tool(CalcCall(-3, "-", 27)) == "R -30\n"
    assert run_tool(CalcCall(6, "*", 7)) == "R 42\n"
    assert run_tool(Malformed("C oops")) == "R ERR\n"


@pytest.mark.parametrize(
    ("turns", "reward"),
    [
        (PERFECT, 1.0),
        (["C 37+48", "C 85-12", "A 73"], 1.0),  # newlines are optional
        (["C 37+48\n", "C 85-12\n", "A 74\n"], 0.0),  # wrong answer
        (["C 37+48\n", "A 73\n"], 0.0),  # skipped a call
        (["A 73\n"], 0.0),  # no calls at all
        (["C 37+48\n", "C 85-12\n", "C 73+0\n", "A 73\n"], 0.0),  # an extra call
        (["C 48+37\n", "C 85-12\n", "A 73\n"], 0.0),  # not the question's chain
        (["C 37+48\n", "oops\n", "C 85-12\n", "A 73\n"], 0.0),  # malformed turn
        (["C 37+48\n", "C 85-12\n"], 0.0),  # never answered
        ([], 0.0),
    ],
)
def test_score(turns: list[str], reward: float) -> None:
    assert score(PROBLEM, turns) == reward


def test_error_free_transcripts_are_well_formed_and_score_one() -> None:
    rng = random.Random(1)
    for _ in range(50):
        problem = sample_problem(TaskConfig(num_operands=4), rng)
        transcript = synthetic_transcript(problem, rng, error_rate=0.0)
        lines = transcript.splitlines(keepends=True)
        assert lines[0] == problem.question + "\n" and transcript.endswith("\n")
        for call, reply in zip(lines[1::2], lines[2::2]):
            assert run_tool(parse_action(call)) == reply
        assert score(problem, _policy_turns(transcript)) == 1.0


def test_erroneous_transcripts_parse_and_score_zero() -> None:
    rng = random.Random(2)
    for _ in range(100):
        problem = sample_problem(TaskConfig(), rng)
        turns = _policy_turns(synthetic_transcript(problem, rng, error_rate=1.0))
        assert not any(isinstance(parse_action(t), Malformed) for t in turns)
        assert score(problem, turns) == 0.0


def test_transcripts_are_reproducible_and_mix_errors_at_the_rate() -> None:
    problems = [sample_problem(TaskConfig(), random.Random(i)) for i in range(400)]
    rng_a, rng_b = random.Random(3), random.Random(3)
    a = [synthetic_transcript(p, rng_a, 0.5) for p in problems]
    assert a == [synthetic_transcript(p, rng_b, 0.5) for p in problems]
    perfect = sum(score(p, _policy_turns(t)) for p, t in zip(problems, a)) / len(a)
    assert 0.4 < perfect < 0.6
