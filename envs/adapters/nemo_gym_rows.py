"""NeMo Gym's dataset rows (one JSON object a line: `responses_create_params` with the prompt's input and the tools,
plus the server's own fields such as `expected_count`) read into turnkeep's prompts, and what of them cannot be mapped.

The prompt: turnkeep's episode prompt is one user message, so the row's `instructions`, then its system/developer
messages, then its user messages are joined in that order by a blank line (the instructions ahead of the request, as
a chat template puts a system message first). A row whose input holds an assistant turn, a tool output or a
non-text part (an image) is refused, as is a tool that is not a function (a built-in web search) and a row sent to
an agent other than a simple_agent (which is what turnkeep plays: tool calls to the server's routes, then verify).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

PROMPT_ROLES = ("system", "developer", "user")


class RowError(ValueError):
    """A row that cannot be mapped; the message names the row and the fix."""


@lru_cache(maxsize=16)
def read_rows(path: Path) -> tuple[dict[str, Any], ...]:
    if not path.is_file():
        raise RowError(f"nemo_gym: no data file {path}; set options.data to a jsonl of the server's rows")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise RowError(f"nemo_gym: {path}:{number} is not JSON ({err.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("responses_create_params"), dict):
            raise RowError(f"nemo_gym: {path}:{number} has no responses_create_params object; each line must be a "
                           f"NeMo Gym row")
        rows.append(row)
    if not rows:
        raise RowError(f"nemo_gym: {path} holds no rows")
    return tuple(rows)


def prompt_of(row: dict[str, Any], where: str = "a row") -> str:
    """The row's instructions and system/developer/user messages as one prompt (see the module docstring)."""
    params = row["responses_create_params"]
    parts = [params["instructions"]] if params.get("instructions") else []
    items = params.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RowError(f"nemo_gym: {where} has no input messages")
    by_role: dict[str, list[str]] = {role: [] for role in PROMPT_ROLES}
    for item in items:
        role = item.get("role") if isinstance(item, dict) else None
        if role not in PROMPT_ROLES or item.get("type", "message") != "message":
            raise RowError(f"nemo_gym: {where} has an input item of role {role!r} (type {item.get('type')!r}); only "
                           f"system, developer and user messages map to turnkeep's prompt")
        by_role["developer" if role == "system" else role].append(_text(item["content"], where))
    return "\n\n".join(parts + by_role["developer"] + by_role["user"])


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else [content]:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RowError(f"nemo_gym: {where} has a {kind!r} content part; turnkeep's prompt is text only")
        texts.append(part["text"])
    return "".join(texts)


def tools_of(row: dict[str, Any], where: str = "a row") -> list[dict[str, Any]]:
    """The row's function tools (the Responses API's flat shape)."""
    tools = row["responses_create_params"].get("tools") or []
    for tool in tools:
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise RowError(f"nemo_gym: {where} has a {tool.get('type')!r} tool; only function tools map to the "
                           f"resources server's routes")
        if tool["name"] in ("seed_session", "verify", "aggregate_metrics"):
            raise RowError(f"nemo_gym: {where} names a tool {tool['name']!r}, a route of the server itself")
    return tools


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The tools as chat templates list them (the Chat Completions shape, as Qwen's `tools`)."""
    return [{"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                              "parameters": tool.get("parameters") or {"type": "object"}}}
            for tool in tools] or None


def check_rows(rows: tuple[dict[str, Any], ...], path: Path, agents: dict[str, str] | None) -> None:
    """Every row maps (prompt, tools, agent); `agents`: the server config's agents (None: attached by URL)."""
    for number, row in enumerate(rows, 1):
        where = f"{path} row {number}"
        prompt_of(row, where)
        tools_of(row, where)
        ref = row.get("agent_ref")
        if agents is None or not isinstance(ref, dict):
            continue
        kind = agents.get(ref.get("name"))
        if kind != "simple_agent":
            raise RowError(f"nemo_gym: {where} is run by agent {ref.get('name')!r} ({kind or 'not in the config'}), "
                           f"not a simple_agent: its own loop (a gymnasium game, a harness calling its own model) "
                           f"does not map to tool calls; pick rows of a simple_agent server")
