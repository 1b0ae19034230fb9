"""Tool calls written the way Qwen-style chat templates teach models to write them.

A turn holds zero or more blocks

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37+48"}}
    </tool_call>

around or between ordinary text. `parse_tool_calls(turn_text)` returns the calls in
order and the text outside the blocks; a block that is not one JSON object with a
string `name` and an object `arguments` raises `ToolCallError`, whose message names the
block and the problem, so an environment can send it back as the observation:

    try:
        calls, text = parse_tool_calls(turn_text)
    except ToolCallError as err:
        return StepResult(observation=format_tool_result({"error": str(err)}), done=False)

Accepted as well, because models write them: `"parameters"` for `"arguments"` (Llama 3.1),
and `arguments` given as a string holding a JSON object (OpenAI's wire format). Missing
arguments are an empty object. The template renders the reply (`StepResult(observation=
..., role="tool")`) inside its own `<tool_response>` tags, so `format_tool_result` only
turns a value into text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAG = re.compile(f"{re.escape(OPEN)}|{re.escape(CLOSE)}")


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


class ParsedTurn(NamedTuple):
    calls: list[ToolCall]
    """The turn's tool calls, in order."""
    text: str
    """The turn's text outside the blocks; stripped of surrounding whitespace when there were blocks,
    the whole turn as is when there were none."""


class ToolCallError(ValueError):
    """A `<tool_call>` block that cannot be read; the message names the block (1-based) and why."""

    def __init__(self, block: int, problem: str) -> None:
        super().__init__(f"tool call {block}: {problem}")
        self.block = block
        self.problem = problem


def parse_tool_calls(turn_text: str) -> ParsedTurn:
    """The calls in a turn and the text outside them; ToolCallError for the first unreadable block."""
    calls: list[ToolCall] = []
    outside: list[str] = []
    position, opened = 0, None
    for tag in _TAG.finditer(turn_text):
        block = len(calls) + 1
        if tag.group() == OPEN:
            if opened is not None:
                raise ToolCallError(block, f"{OPEN} opened again before {CLOSE}")
            outside.append(turn_text[position:tag.start()])
            opened = tag.end()
        else:
            if opened is None:
                raise ToolCallError(block, f"{CLOSE} without an opening {OPEN}")
            calls.append(_read_call(block, turn_text[opened:tag.start()]))
            position, opened = tag.end(), None
    if opened is not None:
        raise ToolCallError(len(calls) + 1, f"{OPEN} is never closed with {CLOSE} (was the turn cut short?)")
    outside.append(turn_text[position:])
    text = "".join(outside)
    return ParsedTurn(calls, text.strip() if calls else text)


def format_tool_call(call: ToolCall) -> str:
    """The block a model writes for `call` (as Qwen's template renders an assistant's tool_calls)."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def format_tool_result(result: Any) -> str:
    """A tool's reply as message content: text as is, anything else as JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False)


def _read_call(block: int, body: str) -> ToolCall:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        raise ToolCallError(block, f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if not isinstance(value, dict):
        raise ToolCallError(block, f"expected a JSON object with \"name\" and \"arguments\", got "
                                   f"{type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallError(block, "\"name\" must be a non-empty string" if "name" in value else "no \"name\"")
    key = "arguments" if "arguments" in value else "parameters"
    arguments = value.get(key, {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            raise ToolCallError(block, f"\"{key}\" is a string that is not valid JSON ({err.msg})") from None
    if not isinstance(arguments, dict):
        raise ToolCallError(block, f"\"{key}\" must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name, arguments)
