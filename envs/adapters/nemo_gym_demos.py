"""What the made-up tiny model learns a NeMo Gym resources server from: the rollouts NeMo Gym ships with the server
(`data/example_rollouts.jsonl`: a real model's function calls and final message for the example rows), played again
against the real server, so every observation in them is the server's own reply.

Each rollout's `response.output` becomes turns: the calls made before their outputs form one turn (one
`<tool_call>` block each, on one line), the final assistant message is the last turn. A share
(`options.demo_error_rate`) carry one mistake: a call's integer argument off by one or two, a call turn left out, or
a tool's name misspelt (answered with the adapter's unknown-tool error). Conversations are rendered in
`tool_chat_demos.TEMPLATE`'s lines (one message a line, a tool's reply inside `<tool_response>` tags).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from turnkeep.envs.adapters.nemo_gym_rows import prompt_of, read_rows
from turnkeep.envs.adapters.nemo_gym_server import ResourcesServer, python_of
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.tool_calls import CLOSE, OPEN
from turnkeep.envs.tool_chat_demos import one_line, played_conversation
from turnkeep.schemas.rollout import Problem

TOKENS = (OPEN, CLOSE, "<tool_response>", "</tool_response>", '{"name": "', '", "arguments": {', "}}")
"""Single tokens of the tiny tokenizer: the tags and the calls' fixed JSON."""

_PLAYED: dict[tuple[str, str, tuple[str, ...]], str] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Episode:
    row: dict[str, Any]
    turns: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    """Call turns: (text before the calls, ((name, arguments JSON), ...))."""
    final: str

    def texts(self) -> tuple[str, ...]:
        return tuple(_turn_text(text, calls) for text, calls in self.turns) + (self.final,)


def demonstrations(cls: type, rng: random.Random, count: int, options: BaseModel) -> list[str]:
    episodes = episodes_of(options)
    picked = []
    for _ in range(count):
        episode = rng.choice(episodes)
        picked.append(_mistake(episode, rng) if rng.random() < options.demo_error_rate else episode)
    key = options.model_dump_json()
    missing = {(json.dumps(e.row, sort_keys=True), e.texts()): e for e in picked
               if (key, json.dumps(e.row, sort_keys=True), e.texts()) not in _PLAYED}
    if missing:
        if options.server is not None:  # started from this thread, which outlives the worker below
            ResourcesServer.shared(python_of(options.python), options.app())
        with ThreadPoolExecutor(1) as pool:  # a thread of its own: the caller may be inside a running event loop
            played = pool.submit(asyncio.run, _play_all(cls, options, list(missing.values()))).result()
        with _LOCK:
            _PLAYED.update({(key, *k): text for k, text in zip(missing, played)})
    return [_PLAYED[(key, json.dumps(e.row, sort_keys=True), e.texts())] for e in picked]


def episodes_of(options: BaseModel) -> list[Episode]:
    """The server's rollouts matched to the rows of `options.data` by their prompt; ValueError when none match."""
    rows = {prompt_of(row): row for row in read_rows(options.data_path())}
    path: Path = options.rollouts_path()
    if not path.is_file():
        raise ValueError(f"nemo_gym: no rollouts at {path} to make demonstrations from; set options.demonstrations "
                         f"to a jsonl of NeMo Gym rollouts, or train a real chat model (model.path)")
    episodes = []
    for line in path.read_text().splitlines():
        rollout = json.loads(line) if line.strip() else {}
        try:
            key = prompt_of(rollout) if isinstance(rollout.get("responses_create_params"), dict) else None
        except ValueError:  # a rollout whose input is not a prompt's: no row has it
            key = None
        if key in rows and isinstance(rollout.get("response"), dict):
            episodes.append(_episode(rows[key], rollout["response"].get("output") or []))
    if not episodes:
        raise ValueError(f"nemo_gym: no rollout of {path} has the input of a row of {options.data_path()}; give "
                         f"options.demonstrations for these rows")
    return episodes


def _episode(row: dict[str, Any], output: list[dict[str, Any]]) -> Episode:
    turns, texts, calls = [], [], []
    for item in output:
        kind = item.get("type")
        if kind == "message" and item.get("role") == "assistant":
            texts.append(" ".join(part.get("text", "") for part in item.get("content") or []))
        elif kind == "function_call":
            calls.append((item["name"], json.dumps(json.loads(item.get("arguments") or "{}"))))
        elif kind == "function_call_output" and calls:
            turns.append((one_line(" ".join(texts)), tuple(calls)))
            texts, calls = [], []
    if calls:
        turns.append((one_line(" ".join(texts)), tuple(calls)))
        texts = []
    return Episode(row, tuple(turns), one_line(" ".join(texts)) or "Done.")


def _mistake(episode: Episode, rng: random.Random) -> Episode:
    if not episode.turns:
        return replace(episode, final=episode.final + " 0")
    index = rng.randrange(len(episode.turns))
    text, calls = episode.turns[index]
    which = rng.randrange(len(calls))
    name, arguments = calls[which]
    numbers = {k: v for k, v in json.loads(arguments).items() if isinstance(v, int) and not isinstance(v, bool)}
    kind = rng.choice(["number", "drop", "name"] if numbers else ["drop", "name"])
    if kind == "drop":
        return replace(episode, turns=episode.turns[:index] + episode.turns[index + 1:])
    if kind == "name":
        call = (name[:-1], arguments)
    else:
        field = rng.choice(sorted(numbers))
        call = (name, json.dumps({**json.loads(arguments), field: numbers[field] + rng.choice([-2, -1, 1, 2])}))
    changed = (text, calls[:which] + (call,) + calls[which + 1:])
    return replace(episode, turns=episode.turns[:index] + (changed,) + episode.turns[index + 1:])


async def _play_all(cls: type, options: BaseModel, episodes: list[Episode]) -> list[str]:
    return list(await asyncio.gather(*(_play(cls, options, episode) for episode in episodes)))


async def _play(cls: type, options: BaseModel, episode: Episode) -> str:
    """The conversation as the template renders it, with the real server's replies."""
    from turnkeep.envs.adapters.nemo_gym_env import ROW_KEY  # late: that module imports this one

    env = cls(Problem(question=prompt_of(episode.row), env="demo", metadata={ROW_KEY: episode.row}),
              EnvContext(options=options))
    return await played_conversation(env, episode.texts())


def _turn_text(text: str, calls: tuple[tuple[str, str], ...]) -> str:
    blocks = "".join(f'{OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{CLOSE}' for name, arguments in calls)
    return f"{text} {blocks}" if text else blocks

