"""What the made-up tiny model learns `tool_chat` from: a Hermes-style chat template that keeps each message on one
line, the tool format's tags as single tokens, and demonstrations drawn from the environment's reasoning-gym tasks.

The template renders a conversation as a real Hermes/Qwen template would in content (the assistant's turns are
`<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>` and `<answer>...</answer>`, a tool's reply
is wrapped in `<tool_response>...</tool_response>`), one message a line, so the tiny model's line protocol holds:
every message ends in "\\n" and the assistant's turns end on it. Newlines inside a message become spaces. The
tools' JSON schemas are not rendered (a 64-token vocabulary has no room for them; the one tool is learnt from the
demonstrations).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable

from pydantic import BaseModel

from turnkeep.envs.environment import Environment
from turnkeep.envs.python_tool import ToolError, run_python
from turnkeep.envs.reasoning_gym_tasks import draw

TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set content = message['content'] | replace('\\n', ' ') %}"
    "{% if message['role'] == 'tool' %}{{ '<tool_response>' + content + '</tool_response>' }}"
    "{% else %}{{ content }}{% endif %}{{ '\\n' }}{% endfor %}"
)
"""The tiny model's chat template for `tool_chat` (the generation prompt is empty, as in the line protocol)."""

CALL_PREFIX = '<tool_call>{"name": "python", "arguments": {"code": '
CALL_SUFFIX = "}}</tool_call>"
TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>", "</answer>",
          '{"name": "python", "arguments": {"code": ', "}}")
"""Single tokens of the tiny tokenizer: the tags and the call's fixed JSON (a real tokenizer has most of them)."""

DEMO_SEED_SALT = 7 * 10 ** 11
"""Demonstrations draw from seeds of their own, apart from the run's training and held-out ones."""


def demonstrations(rng: random.Random, count: int, options: BaseModel) -> list[str]:
    """`count` conversations in the template's lines: the question, a python call of the task's expression, its
    result, the answer (without tools, `options.tools` empty or `max_tool_calls` 0: the question and the answer);
    `options.demo_error_rate` of them answer wrong."""
    tasks = getattr(options, "reasoning_gym", None)
    if tasks is None:
        raise ValueError("tool_chat makes demonstrations from options.reasoning_gym tasks; set them, or train a real "
                         "chat model (model.path) that needs none")
    calls = bool(getattr(options, "tools", True)) and getattr(options, "max_tool_calls", 1) > 0
    conversations = []
    for _ in range(count):
        name = rng.choice(tasks.tasks)
        entry = draw(tasks, name, "train", DEMO_SEED_SALT, rng.randrange(10 ** 7))
        conversations.append(_conversation(entry, rng, rng.random() < options.demo_error_rate, calls))
    return conversations


def _conversation(entry: dict, rng: random.Random, wrong: bool, calls: bool = True) -> str:
    """The task's expression computed with the tool (`calls`), then the task's answer (for countdown the expression
    itself); a wrong one answers off by a little, half of those without calling the tool."""
    question = one_line(entry["question"])
    code = entry.get("metadata", {}).get("expression")
    result = _evaluated(code) if isinstance(code, str) else None
    answer = one_line(str(entry["answer"]))
    if wrong:
        answer = _off_by_a_little(answer, rng)
    if result is None or (wrong and rng.random() < 0.5) or not calls:  # nothing to compute, a guess, or no tool
        return f"{question}\n<answer>{answer}</answer>\n"
    call = f"{CALL_PREFIX}{json.dumps(one_line(code))}{CALL_SUFFIX}"
    return f"{question}\n{call}\n<tool_response>{result}</tool_response>\n<answer>{answer}</answer>\n"


def _evaluated(code: str) -> str | None:
    try:
        return run_python({"code": code})
    except ToolError:
        return None


def _off_by_a_little(value: str, rng: random.Random) -> str:
    try:
        return str(int(value) + rng.choice([-2, -1, 1, 2]))
    except ValueError:
        return value + "0"


async def played_conversation(env: Environment, turns: Iterable[str]) -> str:
    """A demonstration played against a real environment: its prompt, then each scripted turn and the environment's
    reply, in the template's lines (an adapter's environment whose replies only the environment knows)."""
    try:
        await env.begin()
        lines = [one_line(env.prompt())]
        for turn in turns:
            lines.append(one_line(turn))
            result = await env.step(turn)
            if result.observation is not None:
                lines.append(f"<tool_response>{one_line(result.observation)}</tool_response>")
            if result.done:
                break
    finally:
        await env.close()
    return "".join(line + "\n" for line in lines)


def one_line(text: str) -> str:
    """A message as the template renders it: newlines become spaces."""
    return text.replace("\n", " ")
