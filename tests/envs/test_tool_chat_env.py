"""`tool_chat`: real-format tool calls parsed and run, a malformed one answered as the observation, the final answer
scored by the task's verifier or the record's answer, the state exported and restored."""

from __future__ import annotations

import asyncio

import pytest

from turnkeep.envs.environment import EnvContext
from turnkeep.envs.reasoning_gym_tasks import METADATA_KEY, ReasoningGymProblems, ReasoningGymTasks
from turnkeep.envs.tool_calls import ToolCall, format_tool_call
from turnkeep.envs.tool_chat_env import ToolChatEnvironment, ToolChatOptions, answers_match
from turnkeep.schemas.rollout import Problem

TASKS = ReasoningGymTasks(tasks=["chain_sum"], config={"chain_sum": {"min_terms": 2, "max_terms": 3,
                                                                     "min_digits": 1, "max_digits": 2}},
                          heldout_size=5)


def _rg_problem(position: int = 0) -> Problem:
    record = ReasoningGymProblems({"math": TASKS}, seed=0).record(position)
    return Problem(question=record.prompt, answer=record.answer, env="math", metadata=record.metadata)


def _env(problem: Problem, **options) -> ToolChatEnvironment:
    return ToolChatEnvironment(problem, EnvContext(options=ToolChatOptions(**options)))


def _call(code: str) -> str:
    return format_tool_call(ToolCall("python", {"code": code}))  # the block as Qwen's template writes it


def test_a_qwen_style_call_runs_the_tool_and_the_answer_is_scored_by_the_tasks_verifier() -> None:
    problem = _rg_problem()
    expression = problem.metadata[METADATA_KEY]["metadata"]["expression"]
    env = _env(problem)
    assert env.prompt() == problem.question and env.tools()[0]["function"]["name"] == "python"
    called = asyncio.run(env.step(f"Let me compute.\n{_call(expression)}"))
    assert (called.observation, called.done, called.role) == (str(problem.answer), False, "tool")
    final = asyncio.run(env.step(f"The sum is <answer>{problem.answer}</answer>"))
    assert final == type(final)(observation=None, done=True) and env.answer == str(problem.answer)
    assert env.reward() == 1.0
    wrong = _env(problem)
    asyncio.run(wrong.step(f"<answer>{int(problem.answer) + 1}</answer>"))
    assert wrong.reward() == 0.0


@pytest.mark.parametrize(("turn", "told"), [
    ('<tool_call>\n{"name": "python", "arguments": {"code": "1+"}\n</tool_call>', "tool call 1: not valid JSON"),
    ("<tool_call>\n{\"name\": \"python\"", "is never closed"),
    (format_tool_call(ToolCall("shell", {"cmd": "ls"})), "unknown tool 'shell'; the tools are python"),
    (_call("__import__('os')"), "is not allowed"),
])
def test_a_call_that_cannot_run_is_sent_back_as_the_observation(turn: str, told: str) -> None:
    env = _env(Problem(question="2+2?", answer=4, env="math"))
    result = asyncio.run(env.step(turn))
    assert result.done is False and result.role == "tool" and '"error"' in result.observation
    assert told in result.observation
    asyncio.run(env.step("<answer>4</answer>"))  # the episode goes on to its answer
    assert env.reward() == 1.0


def test_the_tool_budget_is_enforced_and_several_calls_in_a_turn_each_answer() -> None:
    env = _env(Problem(question="q", answer="3", env="math"), max_tool_calls=2)
    both = asyncio.run(env.step(_call("1+1") + "\n" + _call("2*3")))
    assert both.observation == "2\n6"
    spent = asyncio.run(env.step(_call("1+2")))
    assert "no tool calls left (2 per episode)" in spent.observation


def test_without_answer_tags_the_whole_final_turn_is_the_answer_and_numbers_compare_as_numbers() -> None:
    env = _env(Problem(question="q", answer=1010, env="math"))
    asyncio.run(env.step(" 1,010.0 "))
    assert env.reward() == 1.0
    assert answers_match("Paris", "paris") and not answers_match("4", "5") and not answers_match("x", None)
    silent = _env(Problem(question="q", answer=1, env="math"))
    assert silent.reward() == 0.0  # no answer yet


def test_the_state_exports_and_a_fresh_environment_restores_it_exactly() -> None:
    problem = _rg_problem(1)
    expression = problem.metadata[METADATA_KEY]["metadata"]["expression"]
    live = _env(problem)
    asyncio.run(live.step("<tool_call>{broken</tool_call>"))
    asyncio.run(live.step(_call(expression)))
    state = live.export_state()
    restored = _env(problem)
    restored.restore_state(state)
    assert restored.export_state() == state
    for env in (live, restored):
        asyncio.run(env.step(f"<answer>{problem.answer}</answer>"))
    assert live.reward() == restored.reward() == 1.0


@pytest.mark.parametrize(("state", "named"), [
    ({"turns": "x"}, "must be a list of strings"),
    ({"turns": [], "files": {}}, "must be {'turns'"),
    ({"turns": ["<answer>1</answer>", "again"]}, "turns after its final answer"),
])
def test_a_corrupt_state_is_refused_with_the_reason(state: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        _env(Problem(question="q", answer=1, env="math")).restore_state(state)


def test_options_name_an_unknown_task_or_setting_in_one_line() -> None:
    with pytest.raises(ValueError, match="reasoning_gym task 'no_such_task'"):
        ToolChatOptions(reasoning_gym={"tasks": ["no_such_task"]})
    with pytest.raises(ValueError, match="reasoning_gym.config names \\['countdown'\\]"):
        ToolChatOptions(reasoning_gym={"tasks": ["chain_sum"], "config": {"countdown": {}}})


def test_a_model_that_answers_at_length_is_read_by_its_last_number_and_tags_still_win() -> None:
    problem = _rg_problem()
    answer = str(problem.answer)
    env = _env(problem, answer="last_number", instruction="Answer with the number only.", tools=[])
    assert env.prompt() == f"{problem.question} Answer with the number only." and env.tools() is None
    asyncio.run(env.step(f"Adding them up step by step, 1,000 less is not it: the total is {answer}."))
    assert env.answer == answer and env.reward() == 1.0
    tagged = _env(problem, answer="last_number")
    asyncio.run(tagged.step(f"<answer>{answer}</answer> and then 7"))
    assert tagged.answer == answer
    plain = _env(problem)  # the default reads the whole turn: the same words score less than 1
    asyncio.run(plain.step(f"the total is {answer}."))
    assert plain.answer == f"the total is {answer}." and plain.reward() < 1.0


def test_tools_are_described_in_the_system_message_for_a_template_that_lists_none() -> None:
    env = _env(_rg_problem(), system_prompt="You add numbers.", tools_in_system_prompt=True)
    system = env.system_prompt()
    assert system.startswith("You add numbers.\n\n") and '"name": "python"' in system and "<tool_call>" in system
    assert _env(_rg_problem()).system_prompt() is None
    assert _env(_rg_problem(), system_prompt="S").system_prompt() == "S"
