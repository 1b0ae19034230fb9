"""`tool_chat`: a task in the model's own tool format, scored by a verifier.

The model calls tools the way its chat template teaches it (`<tool_call>` JSON for Qwen/Hermes templates; the
template lists the tools from `tools()`), each result goes back as a `tool` message, and a turn without a tool call
is the final answer: the text inside its last `<answer>...</answer>`, or the whole turn. A call that cannot be read
(bad JSON, an unknown tool, code the calculator refuses) is answered with `{"error": "..."}` as the tool's message,
so the model sees what was wrong and may try again; the episode goes on until its final answer or
`rollout.max_turns`.

Problems come from reasoning-gym tasks (`options.reasoning_gym`, scored by each task's own verifier) or from the
run's prompts file (`data.train`, each record's `answer`, compared as a number when both sides are numbers, else as
trimmed, case-insensitive text).

Recovery: `exported`. The state is the turns so far (the tools are pure, so they are played again on restore) and
is checked on the way back; a cut turn continues from its journaled tokens at the `token` level like the other kinds.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.envs import tool_chat_demos
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.envs.python_tool import SCHEMA, ToolError, run_python
from turnkeep.envs.reasoning_gym_tasks import METADATA_KEY, ReasoningGymTasks, TaskError, check_tasks, score
from turnkeep.envs.tool_calls import ToolCall, ToolCallError, format_tool_result, parse_tool_calls
from turnkeep.schemas.rollout import Problem

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
TOOLS = {"python": (SCHEMA, run_python)}


class ToolChatOptions(BaseModel):
    """`[environments.<name>] kind = "tool_chat"`'s options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reasoning_gym: ReasoningGymTasks | None = None
    """reasoning-gym tasks: the run's prompts when `data.train` is unset, and the held-out set. None: the problems
    come from `data.train`, each with an `answer`."""
    tools: list[Literal["python"]] = ["python"]
    """The tools the model may call (listed to its chat template)."""
    max_tool_calls: int = Field(default=8, ge=0)
    """Calls per episode; later ones are answered with an error telling the model to answer."""
    demo_error_rate: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of the made-up tiny model's demonstrations that end on a wrong answer (room for RL to improve)."""
    system_prompt: str | None = None
    """The conversation's system message (None: the chat template's own default, if it writes one)."""
    tools_in_system_prompt: bool = False
    """Describe the tools, and how to call them, at the end of the system message: for a chat template that lists
    none (SmolLM2's ChatML). The tools still go to templates that do list them."""
    instruction: str = ""
    """Text put after every question (e.g. "Answer with the number only.")."""
    answer: Literal["tag_or_turn", "last_number"] = "tag_or_turn"
    """How the final turn is read: the text in its last `<answer>...</answer>`, else the whole turn; or
    `last_number`: that tag's text if there is one, else the last number in the turn (GSM8K-style), else the turn."""

    def model_post_init(self, context: Any) -> None:
        if self.reasoning_gym is not None:
            try:
                check_tasks(self.reasoning_gym)
            except TaskError as err:
                raise ValueError(str(err)) from None


class ToolChatEnvironment(Environment):
    kind = "tool_chat"
    recovery_mode = "exported"
    Options = ToolChatOptions
    demonstration_template: ClassVar[str] = tool_chat_demos.TEMPLATE
    demonstration_tokens: ClassVar[tuple[str, ...]] = tool_chat_demos.TOKENS

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        self._problem = problem
        self._options = ctx.options if isinstance(ctx.options, ToolChatOptions) else ToolChatOptions()
        self._tool_latency_s = ctx.tool_latency_s
        self._turns: list[str] = []
        self._calls = 0
        self._answer: str | None = None

    def prompt(self) -> str:
        instruction = self._options.instruction
        return f"{self._problem.question} {instruction}" if instruction else self._problem.question

    def tools(self) -> list[dict[str, Any]] | None:
        return [TOOLS[name][0] for name in self._options.tools] or None

    def system_prompt(self) -> str | None:
        tools = self.tools() if self._options.tools_in_system_prompt else None
        parts = [part for part in (self._options.system_prompt, tools and describe_tools(tools)) if part]
        return "\n\n".join(parts) if parts else None

    async def step(self, turn_text: str) -> StepResult:
        result = self._act(turn_text)
        if result.observation is not None and self._tool_latency_s:
            await asyncio.sleep(self._tool_latency_s)
        return result

    def reward(self) -> float:
        if self._answer is None:
            return 0.0
        entry = self._problem.metadata.get(METADATA_KEY)
        if entry is not None:
            return score(entry, self._answer)
        return float(answers_match(self._answer, self._problem.answer))

    def export_state(self) -> dict[str, Any]:
        return {"turns": list(self._turns)}

    def restore_state(self, state: dict[str, Any]) -> None:
        if self._turns:
            raise RuntimeError("restore_state needs a fresh tool_chat environment")
        if not isinstance(state, dict) or set(state) != {"turns"}:
            raise ValueError(f"tool_chat state must be {{'turns': [...]}}, got {str(state)[:80]}")
        turns = state["turns"]
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise ValueError("tool_chat state 'turns' must be a list of strings")
        for turn in turns:  # the tools are pure: playing the turns again rebuilds the episode
            if self._answer is not None:
                raise ValueError("tool_chat state has turns after its final answer")
            self._act(turn)

    @property
    def answer(self) -> str | None:
        """The final answer, once given."""
        return self._answer

    @classmethod
    def demonstrations(cls, rng, count: int, options: BaseModel) -> list[str]:
        return tool_chat_demos.demonstrations(rng, count, options)

    def _act(self, turn_text: str) -> StepResult:
        self._turns.append(turn_text)
        try:
            calls, text = parse_tool_calls(turn_text)
        except ToolCallError as err:
            return StepResult(observation=format_tool_result({"error": str(err)}), done=False)
        if not calls:
            self._answer = final_answer(text, self._options.answer)
            return StepResult(observation=None, done=True)
        return StepResult(observation="\n".join(self._call(call) for call in calls), done=False)

    def _call(self, call: ToolCall) -> str:
        self._calls += 1
        if self._calls > self._options.max_tool_calls:
            return format_tool_result({"error": f"no tool calls left ({self._options.max_tool_calls} per "
                                                f"episode); give the final answer"})
        if call.name not in self._options.tools:
            return format_tool_result({"error": f"unknown tool {call.name!r}; the tools are "
                                                f"{', '.join(self._options.tools) or 'none'}"})
        try:
            return format_tool_result(TOOLS[call.name][1](call.arguments))
        except ToolError as err:
            return format_tool_result({"error": str(err)})


def final_answer(text: str, how: str) -> str:
    """The answer a final turn gives, read as `ToolChatOptions.answer` says."""
    tagged = _ANSWER.findall(text)
    if tagged:
        return tagged[-1].strip()
    numbers = _NUMBER.findall(text) if how == "last_number" else []
    return numbers[-1].replace(",", "") if numbers else text.strip()


def describe_tools(tools: list[dict[str, Any]]) -> str:
    """The tools for a model whose chat template lists none, in the Hermes format `envs/tool_calls.py` parses."""
    schemas = "\n".join(json.dumps(tool.get("function", tool)) for tool in tools)
    return ("You may call these tools. Each is a JSON schema:\n<tools>\n" + schemas + "\n</tools>\n"
            'To call one, write <tool_call>{"name": NAME, "arguments": {ARGUMENTS}}</tool_call>; its result comes '
            "back in the next message.")


def answers_match(given: str, expected: Any) -> bool:
    """Numbers compare as numbers (1e-6 relative), anything else as trimmed, case-insensitive text."""
    if expected is None:
        return False
    mine, theirs = _number(given), _number(str(expected))
    if mine is not None and theirs is not None:
        return math.isclose(mine, theirs, rel_tol=1e-6, abs_tol=1e-9)
    return given.strip().casefold() == str(expected).strip().casefold()


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None
