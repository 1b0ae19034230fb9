"""`openenv`: an OpenEnv environment (a server with reset / step / state), trained through turnkeep's agent loop.

The server is one you run (`options.url`) or one the adapter starts (`options.app`, `package.module:app`, served by
uvicorn once per environment-server process). Every episode holds its own WebSocket session (OpenEnv's HTTP
routes keep no episode between calls), reset with the record's seed: `dataset()` gives one record per seed, so
the siblings of a group play the same game and its advantages compare like with like (`seed_from = "episode"`
resets each sibling with its own `ctx.seed` instead).

Mapping. A policy turn's `<tool_call>` of `options.action_tool` is one action whose fields are the call's
arguments (`tools()` lists it with the action's JSON schema from the server's `/schema`); for an MCP environment
(`options.mcp`) every call is a `call_tool` action of that tool. A turn without a call goes into the action field
`options.text_field`, or, where none is set, is the final answer and ends the episode. Each observation's fields
`options.observation_fields` are the text fed back (one field: its value; several or none named: a JSON object),
the reset's are the prompt. An action the environment refuses (its validation, or an error while acting) is
answered with `{"error": ...}` and the episode goes on. The reward is the sum of the step rewards (or the last).

The reset starts in the constructor, on the adapter's own session loop: `prompt()` is synchronous, so it waits
for that reset to finish (milliseconds on a warm loopback server; the first episode of a process also waits for
the server it starts). Nothing else blocks the environment server's loop.

Recovery: `replay`. OpenEnv exports no state, but an environment that draws its randomness from its reset seed
is deterministic given the seed and the actions: a fresh session reset with the same seed replays the journaled
turns (`options.replay = false` for one that is not: its unfinished siblings then start over).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import random
from concurrent.futures import Future
from typing import Any, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.envs import tool_chat_demos
from turnkeep.envs.adapters.openenv_session import LOOP, SERVERS, Session, SessionError, fetch_json, open_session
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.envs.tool_calls import CLOSE, OPEN, ToolCallError, format_tool_result, parse_tool_calls
from turnkeep.schemas.choices import RecoveryMode
from turnkeep.schemas.rollout import Problem, PromptRecord

SEED_KEY = "seed"
"""The record's metadata key holding its reset seed."""
HELDOUT_SEED_BASE = 10 ** 9
"""Held-out seeds start here, apart from the training ones (0, 1, ...)."""
DEMO_SEED_BASE = 2 * 10 ** 9
"""Demonstrations play seeds of their own."""
DEMO_SESSIONS = 16
"""Sessions the demonstrations hold at once."""
_BASE_FIELDS = {"done", "reward", "metadata"}
_REFUSED = {"VALIDATION_ERROR", "EXECUTION_ERROR"}
"""Error codes of an action the environment refuses: told to the policy, the episode goes on."""


class OpenEnvOptions(BaseModel):
    """`[environments.<name>] kind = "openenv"`'s options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None
    """`http://host:port` of a running OpenEnv server (set this or `app`)."""
    app: str | None = None
    """`package.module:app` of an OpenEnv FastAPI app, which the adapter serves with uvicorn on a free loopback
    port, once per environment-server process (set this or `url`)."""
    action_tool: str = "step"
    """The tool name the policy calls to act: a `<tool_call>` of it is one action whose fields are its arguments."""
    mcp: bool = False
    """true: an MCP environment (OpenEnv's MCPEnvironment): each `<tool_call>` is a `call_tool` action of the
    named tool, and the tools are the environment's `list_tools`."""
    text_field: str | None = None
    """An action field that takes a turn's plain text (a turn without a tool call); None: such a turn is the final
    answer and ends the episode."""
    observation_fields: list[str] = []
    """The observation fields fed back as text (and the reset's as the prompt): one field gives its value, several
    a JSON object of them; []: every field but done, reward and metadata."""
    reward: Literal["sum", "last"] = "sum"
    """The episode's reward from its step rewards: their sum, or the last step's."""
    seed_from: Literal["record", "episode"] = "record"
    """record: reset with the record's seed (every sibling of a group plays the same game); episode: with the
    sibling's own seed (`ctx.seed`, the same for every attempt of a sibling)."""
    train_episodes: int = Field(default=10_000, ge=1)
    """Training records: seeds 0 .. train_episodes - 1."""
    heldout_episodes: int = Field(default=100, ge=0)
    """Held-out records: seeds from 10**9 on."""
    demonstrator: str | None = None
    """`package.module:function` playing the environment for the made-up tiny model's demonstrations:
    `function(observations, rng)` gets the observations so far (the reset's first) and returns the next action's
    fields, a plain turn's text, or None to stop. None: no demonstrations."""
    demo_max_steps: int = Field(default=8, ge=1)
    """Actions per demonstration at most."""
    replay: bool = True
    """false: the environment is not deterministic given its seed and actions; a crash reruns its unfinished
    siblings from scratch."""
    start_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds the server the adapter starts (`app`) has to become healthy."""
    session_wait_s: float = Field(default=120.0, gt=0)
    """Seconds an episode waits for a session on a server at its `max_concurrent_envs` limit."""
    message_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds a reset or step may take."""

    def model_post_init(self, context: Any) -> None:
        if (self.url is None) == (self.app is None):
            raise ValueError("set exactly one of options.url (a running OpenEnv server) and options.app "
                             "(package.module:app, started by turnkeep)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"options.url {self.url!r} is not http://host:port; give the OpenEnv server's base URL")
        for key in ("app", "demonstrator"):
            value = getattr(self, key)
            if value is not None:
                _check_entry(key, value)


def _check_entry(key: str, value: str) -> None:
    module, _, attr = value.partition(":")
    if not module or not attr:
        raise ValueError(f"options.{key} {value!r} is not package.module:name")
    try:
        found = importlib.util.find_spec(module)
    except ImportError:
        found = None
    if found is None:
        raise ValueError(f"options.{key}: module {module!r} is not importable here; install the environment's "
                         f"package (pip install -e <its folder>) or put it on PYTHONPATH")


class OpenEnvEnvironment(Environment):
    kind = "openenv"
    recovery_mode = "replay"
    Options = OpenEnvOptions
    demonstration_template: ClassVar[str] = tool_chat_demos.TEMPLATE
    demonstration_tokens: ClassVar[tuple[str, ...]] = (OPEN, CLOSE, "<tool_response>", "</tool_response>",
                                                       '{"name": "', '", "arguments": {', "}}")

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        options = ctx.options
        if not isinstance(options, OpenEnvOptions):
            raise ValueError("the openenv adapter needs its options: [environments.<name>] options = "
                             "{ app = \"package.module:app\" } or { url = \"http://host:port\" }")
        self._options = options
        self.recovery_mode = type(self).recovery_mode_for(options)
        record_seed = problem.metadata.get(SEED_KEY)
        self._seed = int(record_seed) if options.seed_from == "record" and record_seed is not None else ctx.seed
        self._rewards: list[float] = []
        self._opening: Future[Opened] = LOOP.submit(_open(options, self._seed))

    @classmethod
    def recovery_mode_for(cls, options: BaseModel) -> RecoveryMode:
        replay = getattr(options, "replay", True)
        return RecoveryMode.REPLAY if replay else RecoveryMode.RESTART_ONLY

    @classmethod
    async def warm_up(cls, options: BaseModel) -> None:
        if isinstance(options, OpenEnvOptions) and options.app is not None:
            await asyncio.wrap_future(LOOP.submit(SERVERS.url_of(options.app, options.start_timeout_s)))

    async def begin(self) -> None:
        await self._wait_opened()  # the server's loop waits here, not in the synchronous prompt()

    def prompt(self) -> str:
        opened = self._opened()
        return opened.text(opened.reset["observation"])

    def tools(self) -> list[dict[str, Any]] | None:
        return self._opened().tools

    def _opened(self) -> "Opened":
        wait_s = self._options.start_timeout_s + self._options.session_wait_s + self._options.message_timeout_s
        try:
            return self._opening.result(wait_s)
        except TimeoutError:
            raise RuntimeError(f"the OpenEnv session (seed {self._seed}) did not open within {wait_s:.0f} s; is "
                               f"the server up? (options.url / options.app)") from None

    async def _wait_opened(self) -> "Opened":
        # Shielded: a cancelled rollout must not cancel the opening itself, which close() still has to close.
        return await asyncio.shield(asyncio.wrap_future(self._opening))

    async def step(self, turn_text: str) -> StepResult:
        opened = await self._wait_opened()
        try:
            calls, text = parse_tool_calls(turn_text)
        except ToolCallError as err:
            return StepResult(observation=format_tool_result({"error": str(err)}), done=False)
        if not calls:
            if self._options.text_field is None:
                return StepResult(observation=None, done=True)
            return await self._act(opened, {self._options.text_field: text.strip()})
        replies = []
        for call in calls:
            if self._options.mcp:
                action = {"type": "call_tool", "tool_name": call.name, "arguments": call.arguments}
            elif call.name != self._options.action_tool:
                replies.append(format_tool_result({"error": f"unknown tool {call.name!r}; the tool is "
                                                            f"{self._options.action_tool!r}"}))
                continue
            else:
                action = dict(call.arguments)
            result = await self._act(opened, action)
            replies.append(result.observation or "")
            if result.done:
                return StepResult(observation="\n".join(replies), done=True)
        return StepResult(observation="\n".join(replies), done=False)

    def reward(self) -> float:
        if not self._rewards:
            return 0.0
        return sum(self._rewards) if self._options.reward == "sum" else self._rewards[-1]

    async def close(self) -> None:
        try:
            opened = await self._wait_opened()
        except Exception:  # the episode already failed on it; nothing was opened
            return
        await asyncio.wrap_future(LOOP.submit(opened.session.close()))

    async def _act(self, opened: "Opened", action: dict[str, Any]) -> StepResult:
        try:
            payload = await asyncio.wrap_future(LOOP.submit(opened.session.step(action)))
        except SessionError as err:
            if err.code not in _REFUSED:
                raise RuntimeError(f"the OpenEnv server at {opened.session.url} failed a step: {err}") from None
            return StepResult(observation=format_tool_result({"error": _refusal(err)}), done=False)
        except Exception as err:  # the connection broke (the server died, a timeout): the rollout fails, retried
            raise RuntimeError(f"the OpenEnv session at {opened.session.url} broke during a step: "
                               f"{type(err).__name__}: {err}") from None
        self._rewards.append(float(payload["reward"] or 0.0))
        return StepResult(observation=opened.text(payload["observation"]), done=payload["done"])

    @classmethod
    def dataset(cls, options: BaseModel, split: Literal["train", "heldout"]) -> list[PromptRecord] | None:
        assert isinstance(options, OpenEnvOptions)
        if split == "train":
            seeds = range(options.train_episodes)
        else:
            seeds = range(HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + options.heldout_episodes)
        # The prompt is the reset's observation, which only a session gives: the record names the episode.
        return [PromptRecord(prompt=f"openenv episode seed {seed}", metadata={SEED_KEY: seed}) for seed in seeds]

    @classmethod
    def demonstrations(cls, rng: random.Random, count: int, options: BaseModel) -> list[str]:
        assert isinstance(options, OpenEnvOptions)
        if options.demonstrator is None:
            raise ValueError("the openenv adapter plays options.demonstrator to write demonstrations; set it to "
                             "package.module:function, or train a real chat model (model.path) that needs none")
        module, _, name = options.demonstrator.partition(":")
        player = getattr(importlib.import_module(module), name)
        seeds = [DEMO_SEED_BASE + rng.randrange(10 ** 6) for _ in range(count)]
        demo_rngs = [random.Random(rng.random()) for _ in range(count)]
        timeout = options.start_timeout_s + count * options.demo_max_steps * options.message_timeout_s
        # The server stays up for the next call (a warm start asks for a batch per step); it dies with the process.
        return LOOP.run(_demonstrations(options, player, seeds, demo_rngs), timeout)


def _refusal(err: SessionError) -> str:
    errors = err.data.get("errors")
    if not isinstance(errors, list) or not errors:
        return f"the environment refused the action: {err.data.get('message', err)}"
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}".lstrip(": ") for e in errors
             if isinstance(e, dict)]
    return "invalid action: " + "; ".join(parts)


class Opened:
    """An episode's open session: its reset, the tools the policy sees, how an observation becomes text."""

    def __init__(self, session: Session, reset: dict[str, Any], tools: list[dict[str, Any]] | None,
                 fields: list[str], mcp: bool = False) -> None:
        self.session, self.reset, self.tools, self._fields, self._mcp = session, reset, tools, fields, mcp

    def text(self, observation: dict[str, Any]) -> str:
        if self._mcp and not self._fields and "tool_name" in observation:
            return _mcp_text(observation)
        fields = self._fields or [key for key in observation if key not in _BASE_FIELDS]
        missing = [key for key in fields if key not in observation]
        if missing:
            raise RuntimeError(f"the OpenEnv observation has no field {missing[0]!r} (it has {sorted(observation)});"
                               f" fix options.observation_fields")
        if len(fields) == 1:
            return format_tool_result(observation[fields[0]])
        return json.dumps({key: observation[key] for key in fields}, ensure_ascii=False)


def _mcp_text(observation: dict[str, Any]) -> str:
    """A `call_tool` observation as a tool's reply: its error, else its text content (else its data as JSON)."""
    error = observation.get("error")
    if error:
        return format_tool_result({"error": error.get("message", str(error)) if isinstance(error, dict) else error})
    result = observation.get("result")
    if not isinstance(result, dict):
        return format_tool_result(result)
    texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]
    if texts:
        return "\n".join(texts)
    return format_tool_result(result.get("structured_content", result.get("data")))


_SCHEMAS: dict[str, dict[str, Any]] = {}
"""The server's `/schema` by URL, fetched once (on `LOOP`)."""


async def _open(options: OpenEnvOptions, seed: int) -> Opened:
    try:
        return await _open_session(options, seed)
    except RuntimeError:
        raise
    except Exception as err:  # a refused connection, a timeout: one error type for the episode's caller
        raise RuntimeError(f"could not open an OpenEnv session at {options.url or options.app} (seed {seed}): "
                           f"{type(err).__name__}: {err}") from None


async def _open_session(options: OpenEnvOptions, seed: int) -> Opened:
    url = options.url or await SERVERS.url_of(options.app or "", options.start_timeout_s)
    url = url.rstrip("/")
    if url not in _SCHEMAS:
        _SCHEMAS[url] = await fetch_json(f"{url}/schema")
    session, reset = await open_session(url, seed, options.session_wait_s, options.message_timeout_s)
    try:
        tools = await _tools(options, session, _SCHEMAS[url])
    except BaseException:
        await session.close()
        raise
    return Opened(session, reset, tools, options.observation_fields, options.mcp)


async def _tools(options: OpenEnvOptions, session: Session, schema: dict[str, Any]) -> list[dict[str, Any]]:
    if options.mcp:
        # list_tools is a step of its own: it changes no game state, so a replay meets the same episode.
        listed = (await session.step({"type": "list_tools"}))["observation"].get("tools", [])
        return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                  "parameters": t.get("input_schema", {})}} for t in listed]
    action = dict(schema.get("action", {}))
    properties = {k: v for k, v in action.get("properties", {}).items() if k != "metadata"}
    parameters = {"type": "object", "properties": properties, "required": action.get("required", [])}
    return [{"type": "function", "function": {"name": options.action_tool, "parameters": parameters,
                                              "description": action.get("description") or action.get("title", "")}}]


async def _demonstrations(options: OpenEnvOptions, player: Callable, seeds: list[int],
                          rngs: list[random.Random]) -> list[str]:
    # A few sessions at a time: the tokenizer's corpus is thousands of games, more than a server's session limit.
    sessions = asyncio.Semaphore(DEMO_SESSIONS)

    async def one(seed: int, rng: random.Random) -> str:
        async with sessions:
            return await _demonstration(options, player, seed, rng)

    return list(await asyncio.gather(*(one(s, r) for s, r in zip(seeds, rngs))))


async def _demonstration(options: OpenEnvOptions, player: Callable, seed: int, rng: random.Random) -> str:
    """One episode played by `player` through a session, as the tiny model's lines."""
    opened = await _open(options, seed)
    try:
        lines, history = [opened.text(opened.reset["observation"])], [opened.reset["observation"]]
        for _ in range(options.demo_max_steps):
            move = player(history, rng)
            if move is None or (isinstance(move, str) and options.text_field is None):
                lines += [move] if move is not None else []  # a final answer ends the episode unanswered
                break
            turn = move if isinstance(move, str) else _call_text(options, move)
            action = {options.text_field: move} if isinstance(move, str) else _action(options, move)
            try:
                payload = await opened.session.step(action)
            except SessionError as err:
                if err.code not in _REFUSED:
                    raise
                lines += [turn, f"<tool_response>{format_tool_result({'error': _refusal(err)})}</tool_response>"]
                continue
            history.append(payload["observation"])
            lines += [turn, f"<tool_response>{opened.text(payload['observation'])}</tool_response>"]
            if payload["done"]:
                break
        return "".join(line.replace("\n", " ") + "\n" for line in lines)
    finally:
        await opened.session.close()


def _call_text(options: OpenEnvOptions, move: dict[str, Any]) -> str:
    if options.mcp:
        name, arguments = move["name"], move.get("arguments", {})
    else:
        name, arguments = options.action_tool, move
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"


def _action(options: OpenEnvOptions, move: dict[str, Any]) -> dict[str, Any]:
    if options.mcp:
        return {"type": "call_tool", "tool_name": move["name"], "arguments": move.get("arguments", {})}
    return dict(move)
