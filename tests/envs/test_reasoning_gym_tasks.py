"""reasoning-gym tasks as a prompt source: a pure function of the seed and the position, training and held-out
problems apart, each scored by its task's own verifier."""

from __future__ import annotations

from turnkeep.config.loader import parse_config
from turnkeep.envs.reasoning_gym_tasks import METADATA_KEY, ReasoningGymProblems, ReasoningGymTasks, score
from turnkeep.workers.prompts import heldout_source, prompt_source

EASY = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def test_records_are_a_pure_function_of_seed_and_position_and_go_round_the_tasks() -> None:
    tasks = ReasoningGymTasks(tasks=["chain_sum", "countdown"], heldout_size=3)
    source = ReasoningGymProblems({"math": tasks}, seed=0)
    first = [source.record(i) for i in range(6)]
    assert first == [ReasoningGymProblems({"math": tasks}, seed=0).record(i) for i in range(6)]
    assert [r.metadata[METADATA_KEY]["metadata"]["source_dataset"] for r in first] == ["chain_sum", "countdown"] * 3
    assert all(r.env == "math" and r.answer is not None for r in first) and source.size is None
    other_seed = [ReasoningGymProblems({"math": tasks}, seed=1).record(i) for i in range(6)]
    assert [r.prompt for r in other_seed] != [r.prompt for r in first]
    # Each record scores 1 with its own answer, through the task's verifier.
    assert all(score(r.metadata[METADATA_KEY], str(r.answer)) == 1.0 for r in first)


def test_no_training_problem_is_a_held_out_one_even_on_a_small_task() -> None:
    """One-digit sums of two terms: about 200 distinct questions, so seeds alone would share many."""
    tasks = ReasoningGymTasks(tasks=["chain_sum"], config=EASY, heldout_size=40)
    heldout = ReasoningGymProblems({"math": tasks}, seed=0, split="heldout")
    assert heldout.size == 40
    held = {heldout.record(i).prompt for i in range(heldout.size)}
    trained = {ReasoningGymProblems({"math": tasks}, seed=0).record(i).prompt for i in range(300)}
    assert held and trained and not held & trained


def test_a_run_with_tool_chat_tasks_draws_its_prompts_and_held_out_set_from_them() -> None:
    cfg = parse_config({"environments": {"math": {"kind": "tool_chat", "options": {
        "reasoning_gym": {"tasks": ["chain_sum"], "config": EASY, "heldout_size": 7}}}}})
    assert prompt_source(cfg).record(0).env == "math"
    assert heldout_source(cfg).size == 7
    calc = parse_config({})
    assert heldout_source(calc) is None and prompt_source(calc).record(0).prompt.startswith("Q ")
