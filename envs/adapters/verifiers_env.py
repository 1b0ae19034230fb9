"""`kind = "verifiers"`: an installed verifiers (v1) environment, its turns played by turnkeep's engine.

    [environments.vault]
    kind = "verifiers"
    options = { env_id = "vf-vault", env_args = { count = 200 }, eval_env_args = { split = "eval" } }

What maps to what (`verifiers_loading` refuses the rest at start-up, in one line):

- prompts: the taskset's tasks (`Taskset.load()` under `env_args`; the held-out set under `env_args` updated with
  `eval_env_args`), each task's wire data in the record's metadata, rebuilt into the episode's `Task`;
- the policy turn: verifiers' chat harness turn, its tool calls in the `<tool_call>` JSON format;
- tools: each task's `toolsets()` (one per episode) and the taskset's (one per process), the very MCP servers a
  verifiers run launches, here registered on an in-process `MCPServer` and called through it (arguments checked
  against the tool's schema); names are `<server>_<tool>` as verifiers' harnesses advertise them; a toolset's
  state is the episode's `trace.state`;
- the reward: `Task.score` over the episode's trace (every `@vf.reward` weighted, summed: `trace.reward`); every
  reward and metric by name in `reward_parts()`;
- `@vf.stop` functions of the trace end the episode after a turn.

Recovery: `replay` (default): a fresh episode steps the journaled turns again; in-process tools that draw no
unseeded randomness, wall-clock or network give back the same observations. `replay = false` for one that does.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import random
from typing import Any, ClassVar, Literal

import verifiers.v1 as vf
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, ConfigDict, Field
from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content
from verifiers.v1.utils.decorators import invoke

from turnkeep.envs import tool_chat_demos
from turnkeep.envs.adapters.verifiers_loading import LoadedTaskset, load, task_of
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.envs.tool_calls import ToolCallError, format_tool_result, parse_tool_calls
from turnkeep.schemas.choices import RecoveryMode
from turnkeep.schemas.rollout import Problem, PromptRecord

TASK_KEY = "verifiers_task"
"""The metadata key of a prompt record's task data (the task's wire form)."""


class VerifiersOptions(BaseModel):
    """`[environments.<name>] kind = "verifiers"`'s options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env_id: str = Field(min_length=1)
    """The installed verifiers environment's id (its taskset package: `vf-vault` imports `vf_vault`)."""
    env_args: dict[str, Any] = {}
    """Its taskset config's fields (what `vf-eval --env.taskset.<field>` sets), for the training prompts."""
    eval_env_args: dict[str, Any] | None = None
    """Fields updated over `env_args` for the held-out prompts (e.g. `{split = "eval"}`); None: no held-out set."""
    max_tasks: int = Field(default=10_000, ge=1)
    """Tasks read from the taskset per split (bounds an infinite one)."""
    replay: bool = True
    """false: the environment is not deterministic given its seed and actions; a crash reruns its unfinished
    siblings from scratch."""
    demo_script: str | None = None
    """`module:function(task_data, rng) -> list[str]`: scripted policy turns for one task, played through the
    environment to make the made-up tiny model's demonstrations; None: none (train a real chat model)."""
    demo_count_tasks: int = Field(default=200, ge=1)
    """Training tasks the demonstrations draw from."""

    def model_post_init(self, context: Any) -> None:
        self.loaded()  # refuses what cannot be mapped at start-up

    def loaded(self, split: Literal["train", "heldout"] = "train") -> LoadedTaskset:
        args = self.env_args if split == "train" else {**self.env_args, **(self.eval_env_args or {})}
        return load(self.env_id, json.dumps(args, sort_keys=True))


class VerifiersEnvironment(Environment):
    kind = "verifiers"
    recovery_mode = "replay"
    Options = VerifiersOptions
    demonstration_template: ClassVar[str] = tool_chat_demos.TEMPLATE
    demonstration_tokens: ClassVar[tuple[str, ...]] = ("<tool_call>", "</tool_call>", "<tool_response>",
                                                       "</tool_response>", '{"name": "', '", "arguments": {')

    _shared: ClassVar[dict[int, list[vf.Toolset]]] = {}
    """The taskset's shared toolsets, one set per taskset per process, set up once."""
    _shared_set_up: ClassVar[set[int]] = set()

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        if not isinstance(ctx.options, VerifiersOptions):
            raise ValueError("verifiers environments need options: set [environments.<name>] options = "
                             "{ env_id = \"<installed verifiers environment>\" }")
        self._options = ctx.options
        self.recovery_mode = type(self).recovery_mode_for(ctx.options)
        self._loaded = ctx.options.loaded("heldout" if problem.metadata.get("split") == "heldout" else "train")
        row = problem.metadata.get(TASK_KEY)
        if not isinstance(row, dict):
            raise ValueError(f"problem has no metadata[{TASK_KEY!r}]: verifiers prompts come from the "
                             f"environment's dataset (leave data.train unset)")
        self._task = task_of(self._loaded, row)
        self._trace = _new_trace(self._task, self._loaded.state_cls)
        self._servers: dict[str, MCPServer] = {}
        self._dispatch: dict[str, tuple[str, str]] = {}
        self._set_up = False
        self._scored = False
        self._register()

    @classmethod
    def recovery_mode_for(cls, options: BaseModel) -> RecoveryMode:
        return RecoveryMode.REPLAY if getattr(options, "replay", True) else RecoveryMode.RESTART_ONLY

    @classmethod
    def dataset(cls, options: BaseModel, split: Literal["train", "heldout"]) -> list[PromptRecord] | None:
        assert isinstance(options, VerifiersOptions)
        if split == "heldout" and options.eval_env_args is None:
            return None
        records = []
        for task in options.loaded(split).taskset.take(options.max_tasks):
            records.append(PromptRecord(prompt=_prompt_text(task.data), metadata={
                TASK_KEY: task.data.model_dump(mode="json", exclude_none=True), "split": split}))
        return records

    @property
    def task(self) -> vf.Task:
        """The episode's verifiers task (its data: the prompt record's row)."""
        return self._task

    def prompt(self) -> str:
        return _prompt_text(self._task.data)

    def tools(self) -> list[dict[str, Any]] | None:
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in self._trace.tools] or None

    async def step(self, turn_text: str) -> StepResult:
        await self._serve()
        try:
            calls, text = parse_tool_calls(turn_text)
        except ToolCallError as err:
            self._record(vf.AssistantMessage(content=turn_text), sampled=True)
            return StepResult(observation=format_tool_result({"error": str(err)}), done=False)
        tool_calls = [vf.ToolCall(id=f"call_{len(self._trace.nodes)}_{i}", name=call.name,
                                  arguments=json.dumps(call.arguments)) for i, call in enumerate(calls)]
        self._record(vf.AssistantMessage(content=text, tool_calls=tool_calls or None), sampled=True)
        if not calls:
            self._trace.root_reply = text
            await self._score_now()
            return StepResult(observation=None, done=True)
        replies = []
        for call, wire in zip(calls, tool_calls):
            reply = await self._call(call.name, call.arguments)
            self._record(vf.ToolMessage(tool_call_id=wire.id, content=reply, name=call.name))
            replies.append(reply)
        done = await self._stopped()
        if done:
            await self._score_now()
        return StepResult(observation="\n".join(replies), done=done)

    def reward(self) -> float:
        self._score()
        return float(self._trace.reward)

    def reward_parts(self) -> dict[str, float]:
        self._score()
        parts = {name: r.score for name, r in self._trace.rewards.items() if r is not None}
        return parts | {name: v for name, v in self._trace.metrics.items() if v is not None}

    async def close(self) -> None:
        self._servers.clear()
        self._own = []

    @classmethod
    def demonstrations(cls, rng: random.Random, count: int, options: BaseModel) -> list[str]:
        from turnkeep.envs.adapters.verifiers_demos import demonstrations  # late: only a tiny model needs them

        assert isinstance(options, VerifiersOptions)
        return demonstrations(cls, rng, count, options)

    # The episode's trace and tools.

    def _record(self, message: vf.Message, sampled: bool = False) -> None:
        parent = len(self._trace.nodes) - 1
        self._trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=sampled))

    def _register(self) -> None:
        """The episode's toolsets on in-process MCP servers, listed for `tools()` before the first turn."""
        self._own = type(self._task).toolsets(self._task.config)
        for toolset in [*self._own, *_shared_toolsets(self._loaded)]:
            # verifiers syncs a toolset's state over the rollout's HTTP state channel; in-process, the channel is
            # the episode's own trace.state.
            toolset._pull_state = _returns(self._trace.state)
            toolset._push_state = _ignores
            server = MCPServer(toolset.server_name or type(toolset).__name__)
            toolset.register(server)
            self._servers[toolset.server_name] = server
            for tool in server._tool_manager.list_tools():  # MCPServer.list_tools() is async, only to read this
                full = f"{toolset.server_name}_{tool.name}" if toolset.server_name else tool.name
                self._dispatch[full] = (toolset.server_name, tool.name)
                self._trace.tools.append(vf.Tool(name=full, description=tool.description or "",
                                                 parameters=tool.parameters))

    async def _serve(self) -> None:
        """The toolsets' async setup, once, before the first call (verifiers runs it as each server starts)."""
        if self._set_up:
            return
        self._set_up = True
        await _set_up_shared(self._loaded)
        for toolset in self._own:
            await toolset.setup()
            await toolset.setup_task(self._task.data)

    async def _call(self, name: str, arguments: dict[str, Any]) -> str:
        target = self._dispatch.get(name) if name else None
        if target is None:
            known = ", ".join(sorted(n for n in self._dispatch if n)) or "none"
            return format_tool_result({"error": f"unknown tool {name!r}; the tools are {known}"})
        server, tool = target
        try:
            result = await self._servers[server].call_tool(tool, arguments)
        except Exception as err:  # noqa: BLE001 - a tool's failure is the model's observation, as in verifiers
            return format_tool_result({"error": f"{type(err).__name__}: {err}"})
        content = mcp_content_to_chat_content(getattr(result, "content", []) or [])
        text = content if isinstance(content, str) else json.dumps(content)
        return format_tool_result({"error": text}) if getattr(result, "is_error", False) else text

    async def _stopped(self) -> bool:
        available = {"trace": self._trace, "task": self._task.data}
        for fn in self._task.hooks("stop"):
            if await _maybe_await(invoke(fn, available)):
                return True
        return False

    async def _score_now(self) -> None:
        if not self._scored:
            self._scored = True
            await self._task.score(self._trace)

    def _score(self) -> None:
        """After an episode cut by turnkeep's turn limit (not by a final answer), `reward()` scores it here."""
        if not self._scored:
            run_to_end(self._score_now())


def _prompt_text(data: vf.TaskData) -> str:
    text = data.prompt_text
    return f"{data.system_prompt}\n\n{text}" if data.system_prompt else text


def _new_trace(task: vf.Task, state_cls: type[vf.State]) -> vf.Trace:
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=vf.AgentInfo(config=vf.AgentConfig()), state=state_cls())
    messages: list[vf.Message] = []
    if task.data.system_prompt:
        messages.append(vf.SystemMessage(content=task.data.system_prompt))
    if isinstance(task.data.prompt, str):
        messages.append(vf.UserMessage(content=task.data.prompt))
    else:
        messages.extend(task.data.prompt or [])
    for i, message in enumerate(messages):
        trace.nodes.append(vf.MessageNode(parent=i - 1 if i else None, message=message))
    return trace


def _shared_toolsets(loaded: LoadedTaskset) -> list[vf.Toolset]:
    key = id(loaded.taskset)
    if key not in VerifiersEnvironment._shared:
        VerifiersEnvironment._shared[key] = type(loaded.taskset).toolsets(loaded.taskset.config)
    return VerifiersEnvironment._shared[key]


async def _set_up_shared(loaded: LoadedTaskset) -> None:
    key = id(loaded.taskset)
    if key not in VerifiersEnvironment._shared_set_up:
        VerifiersEnvironment._shared_set_up.add(key)
        for toolset in _shared_toolsets(loaded):
            await toolset.setup()


def _returns(state: vf.State):
    async def pull() -> vf.State:
        return state
    return pull


async def _ignores(before: bytes) -> None:
    return None


async def _maybe_await(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


def run_to_end(coro) -> Any:
    """Run a coroutine from sync code (verifiers scores and serves tools async; `reward()` and `demonstrations()`
    are sync and may be called from a running loop, where a worker thread holds a loop of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor  # late: only when called inside a running loop

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def import_script(path: str):
    """The function a `demo_script` names; ValueError names the path."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"demo_script {path!r} does not import ({err}); name a module:function") from None


