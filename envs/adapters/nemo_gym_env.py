"""`kind = "nemo_gym"`: a NeMo Gym resources server, trained through its own routes, as NeMo Gym's simple_agent uses it.

    [environments.counter]
    kind = "nemo_gym"
    options = { server = "example_session_state_mgmt" }   # or url = "http://host:port" with data = "rows.jsonl"

What maps to what:
- the prompts: the server's dataset rows (`options.data`, default its `data/example.jsonl`); each row's
  `responses_create_params` input becomes the one user message turnkeep's episode starts with (`nemo_gym_rows`: the
  instructions and system/developer messages, then the user's, joined by a blank line), its `tools` are `tools()`;
- the episode's start: POST `/seed_session` with the row's fields (and `seed`, the episode's seed, where the row has
  none), which sets the session cookie every later call carries;
- a policy turn with `<tool_call>` blocks: each call is POSTed to `/<name>` with its arguments, the body of the
  reply (whatever its status, as simple_agent feeds it back) is the observation, several joined by newlines; a call
  of a tool the row does not list, or one that does not parse, is answered with `{"error": ...}` and the episode goes on;
- a turn without a call: the final assistant message; the whole turn history, as a Responses API response
  (function_call, function_call_output and message items), is POSTed with the row to `/verify`, whose `reward` is the
  episode's reward, and its other numeric fields are `reward_parts()`. An episode cut before a final message is not
  verified and scores 0.

What cannot be mapped is refused at start-up in one line: a server whose config names a model server (a judge in
its verify), rows run by an agent other than a simple_agent (a gymnasium game loop, a harness with its own model),
rows with non-text input or non-function tools.

The server: started by turnkeep with the NeMo Gym venv's python (`options.python`, default the venv
`scripts/nemo_gym_venv.sh` makes: nemo-gym needs Python >= 3.12), once per process on first use, shared by every
episode and killed with the process (`nemo_gym_server`); or attached at `options.url`.

Recovery: `replay`. A fresh instance seeds a new session with the same row and seed and POSTs the same calls in
order; the server must answer them the same (true of a server whose state is the session's and whose randomness is
seeded). `replay = false` declares a server that is not (`restart_only`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.envs import tool_chat_demos
from turnkeep.envs.adapters import nemo_gym_demos
from turnkeep.envs.adapters.nemo_gym_rows import chat_tools, check_rows, prompt_of, read_rows, tools_of
from turnkeep.envs.adapters.nemo_gym_server import ResourcesServer, ServerApp, Session, describe, python_of
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.envs.tool_calls import ToolCall, ToolCallError, format_tool_result, parse_tool_calls
from turnkeep.schemas.choices import RecoveryMode
from turnkeep.schemas.rollout import Problem, PromptRecord

ROW_KEY = "nemo_gym_row"
"""The key of the row in a prompt's metadata."""


class NemoGymOptions(BaseModel):
    """`[environments.<name>] kind = "nemo_gym"`'s options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str | None = None
    """A resources server bundled in the installed nemo_gym by name (`example_session_state_mgmt`), or the path of
    its app folder or of one of its configs/*.yaml; turnkeep starts it. Exactly one of `server` and `url`."""
    url: str | None = None
    """A running resources server to attach to instead (`http://host:port`); needs `data`."""
    python: str | None = None
    """The python of the venv where nemo-gym is installed (None: `.venvs/nemo_gym`, made by
    scripts/nemo_gym_venv.sh)."""
    data: str | None = None
    """A jsonl of the server's rows, the training prompts (None: the server's data/example.jsonl)."""
    heldout_data: str | None = None
    """A jsonl of rows for held-out evaluation (None: the environment has no held-out prompts)."""
    demonstrations: str | None = None
    """A jsonl of NeMo Gym rollouts (`response.output` items) the made-up tiny model learns from (None: the
    server's data/example_rollouts.jsonl); each is matched to a row of `data` by its input."""
    demo_error_rate: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of the demonstrations with one deliberate mistake (a call's number changed, or a call left out)."""
    max_tool_calls: int = Field(default=8, ge=0)
    """Calls per episode; later ones are answered with an error telling the model to answer."""
    startup_timeout_s: float = Field(default=120.0, gt=0)
    """How long the started server may take to answer."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """How long one call of a route may take."""
    replay: bool = True
    """false: the environment is not deterministic given its seed and actions; a crash reruns its unfinished
    siblings from scratch."""

    def model_post_init(self, context: Any) -> None:
        if (self.server is None) == (self.url is None):
            raise ValueError("nemo_gym: set exactly one of options.server (a resources server turnkeep starts) and "
                             "options.url (one already running)")
        if self.url is not None and self.data is None:
            raise ValueError("nemo_gym: options.url needs options.data, the jsonl of that server's rows")
        app = self.app()
        agents = dict(app.agents) if app is not None else None
        for path in filter(None, (self.data_path(), self.heldout_path())):
            check_rows(read_rows(path), path, agents)

    def app(self) -> ServerApp | None:
        """The bundled or given server turnkeep starts (None: attached by URL)."""
        return describe(python_of(self.python), self.server) if self.server is not None else None

    def data_path(self) -> Path:
        app = self.app()
        return Path(self.data).expanduser() if self.data else app.folder / "data" / "example.jsonl"

    def heldout_path(self) -> Path | None:
        return Path(self.heldout_data).expanduser() if self.heldout_data else None

    def rollouts_path(self) -> Path:
        if self.demonstrations:
            return Path(self.demonstrations).expanduser()
        app = self.app()
        if app is None:
            raise ValueError("nemo_gym: a server attached by url has no example rollouts; set options.demonstrations "
                             "to a jsonl of NeMo Gym rollouts")
        return app.folder / "data" / "example_rollouts.jsonl"

    async def connect(self) -> str:
        """The server's URL, started here first if turnkeep runs it."""
        if self.url is not None:
            return self.url
        return await ResourcesServer.shared(python_of(self.python), self.app()).ready(self.startup_timeout_s)


class NemoGymEnvironment(Environment):
    kind = "nemo_gym"
    recovery_mode = "replay"
    Options = NemoGymOptions
    demonstration_template: ClassVar[str] = tool_chat_demos.TEMPLATE
    demonstration_tokens: ClassVar[tuple[str, ...]] = nemo_gym_demos.TOKENS

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        if not isinstance(ctx.options, NemoGymOptions):
            raise ValueError("nemo_gym: the environment needs its options (server or url)")
        row = problem.metadata.get(ROW_KEY)
        if not isinstance(row, dict) or "responses_create_params" not in row:
            raise ValueError(f"nemo_gym: the prompt has no NeMo Gym row in metadata[{ROW_KEY!r}]; leave data.train "
                             f"unset so the prompts come from the server's rows (options.data)")
        self.recovery_mode = type(self).recovery_mode_for(ctx.options)
        self._options, self._row, self._seed = ctx.options, row, ctx.seed
        self._prompt = prompt_of(row)
        self._tools = tools_of(row)
        self._session: Session | None = None
        self._output: list[dict[str, Any]] = []
        self._calls = 0
        self._reward: float | None = None
        self._parts: dict[str, float] = {}

    @classmethod
    def recovery_mode_for(cls, options: BaseModel) -> RecoveryMode:
        return RecoveryMode.REPLAY if getattr(options, "replay", True) else RecoveryMode.RESTART_ONLY

    @classmethod
    async def warm_up(cls, options: BaseModel) -> None:
        assert isinstance(options, NemoGymOptions)
        await options.connect()

    @classmethod
    def dataset(cls, options: BaseModel, split: Literal["train", "heldout"]) -> list[PromptRecord] | None:
        assert isinstance(options, NemoGymOptions)
        path = options.data_path() if split == "train" else options.heldout_path()
        if path is None:
            return None
        return [PromptRecord(prompt=prompt_of(row), metadata={ROW_KEY: row}) for row in read_rows(path)]

    @classmethod
    def demonstrations(cls, rng: random.Random, count: int, options: BaseModel) -> list[str]:
        assert isinstance(options, NemoGymOptions)
        return nemo_gym_demos.demonstrations(cls, rng, count, options)

    def prompt(self) -> str:
        return self._prompt

    def tools(self) -> list[dict[str, Any]] | None:
        return chat_tools(self._tools)

    def reward(self) -> float:
        return self._reward or 0.0

    def reward_parts(self) -> dict[str, float]:
        return dict(self._parts)

    async def step(self, turn_text: str) -> StepResult:
        session = await self._started()
        try:
            calls, text = parse_tool_calls(turn_text)
        except ToolCallError as err:
            return StepResult(observation=format_tool_result({"error": str(err)}), done=False)
        turn = len([item for item in self._output if item["type"] != "function_call_output"])
        if text.strip() or not calls:
            self._output.append(_message(text.strip() if calls else text, turn))
        if not calls:
            await self._verify(session)
            return StepResult(observation=None, done=True)
        replies = [await self._call(session, call, f"call_{turn}_{i}") for i, call in enumerate(calls)]
        return StepResult(observation="\n".join(replies), done=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _started(self) -> Session:
        if self._session is None:
            url = await self._options.connect()
            self._session = Session(url, self._options.request_timeout_s)
            body = {"seed": self._seed, **self._row}
            await self._session.post_json("seed_session", body)
        return self._session

    async def _call(self, session: Session, call: ToolCall, call_id: str) -> str:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        self._output.append({"type": "function_call", "call_id": call_id, "name": call.name, "arguments": arguments,
                             "id": f"fc_{call_id}", "status": "completed"})
        self._calls += 1
        names = [tool["name"] for tool in self._tools]
        if self._calls > self._options.max_tool_calls:
            reply = format_tool_result({"error": f"no tool calls left ({self._options.max_tool_calls} per episode); "
                                                 f"give the final answer"})
        elif call.name not in names:
            reply = format_tool_result({"error": f"unknown tool {call.name!r}; the tools are "
                                                 f"{', '.join(names) or 'none'}"})
        else:
            _, reply = await session.post_text(call.name, call.arguments)
        self._output.append({"type": "function_call_output", "call_id": call_id, "output": reply})
        return reply

    async def _verify(self, session: Session) -> None:
        response = {"id": "resp_turnkeep", "object": "response", "created_at": 0.0, "model": "turnkeep-policy",
                    "output": self._output, "parallel_tool_calls": True, "tool_choice": "auto",
                    "tools": self._tools}
        verified = await session.post_json("verify", {**self._row, "response": response})
        reward = verified.get("reward")
        if not isinstance(reward, (int, float)):
            raise RuntimeError(f"nemo_gym: /verify answered without a numeric reward: {str(verified)[:200]}")
        self._reward = float(reward)
        self._parts = {key: float(value) for key, value in verified.items()
                       if key != "reward" and key not in self._row and isinstance(value, (int, float))}


def _message(text: str, turn: int) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{turn}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
