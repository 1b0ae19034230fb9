"""The public environment API: what you implement to train on your own environment.

An environment is one class; the run's environment server builds one instance per
episode (one sibling of a prompt group) and drives it turn by turn:

    env = YourEnv(problem, ctx)        # problem: the prompt's record; ctx.options: your validated Options
    await env.begin()                  # optional: open what the episode needs that takes time (a session)
    env.prompt()                       # the first user message
    env.step(turn_text)  -> StepResult # once per policy turn: call tools, say whether the episode is over
    ...                                # (observation: the tool's reply, fed back to the policy)
    env.reward()                       # the verifier's reward, after the last step
    env.close()                        # always called once, however the episode ended

Load it with `[environments.<name>] kind = "python"`, `entry = "package.module:Class"`,
`options = {...}` (checked by the class's `Options` pydantic model at start-up), or
serve it from its own process with `turnkeep env-server --entry package.module:Class`
and `kind = "remote"`. The built-in kinds (`envs/calc_env.py` and its variants) are
written against this module exactly as your class would be.

Text: `prompt()` and every observation are message contents; the model's chat
template renders them (`envs/codec.py`: the prompt once, each observation as the
template's text between the end of the policy's turn and the next generation, so
earlier token ids are never re-tokenised), and a policy turn is the text the model
generated up to its end-of-turn token (the token itself is not passed). A tool call
inside a turn is parsed by the environment (`envs.tool_calls.parse_tool_calls` reads
the JSON `<tool_call>` format of Qwen-style templates; `format_tool_result` writes a
reply); `tools()` may list their JSON schemas for templates that show them. The
made-up tiny model's template renders each message as one line, its turns end at the
newline.

Recovery: every class declares `recovery_mode`, which decides what a crash keeps of an
unfinished episode:

- `stateless`: `step` is a deterministic function of the turns so far, so a fresh
  instance `replay()`s the saved policy turns and must give back the same observations
  (checked on restore: a mismatch reruns the sibling from scratch, with the reason).
- `replay`: deterministic given `ctx.seed` (the same for every attempt of a sibling) and the policy turns: a
  restore makes a fresh instance with the seed and `replay()`s the journaled turns, each observation checked
  against the journaled one (a difference reruns the sibling from scratch, named in the log and the audit).
- `exported`: `export_state()` returns a JSON-ready dict at a turn boundary (a snapshot
  saves it with the turn record: only dict/list/str/int/float/bool/None, no bytes, no
  objects); `restore_state(state)` takes it back on a fresh instance. restore_state
  must validate what it is given (it comes from disk) and raise ValueError naming the
  problem; the restore then refuses the snapshot's agent instead of continuing a
  broken episode.
- `restart_only`: the state cannot be saved (a live process, a remote session); after a
  crash the episode starts over (its sealed siblings are still kept).

Group scoring: with `group_scored = True` the reward of every sibling of a group comes
from `score_group(problem, sibling_turns)` over all siblings at once (a pairwise judge);
`reward()` is then only a per-sibling preliminary, and a failed sibling reruns its group.

Warm start: a class may offer `demonstrations(rng, count, options)`: whole
conversations in the tiny model's line protocol (the prompt line, then each policy
turn line followed by its observation line), which the made-up tiny model
(`[model.tiny] demonstrations = "<env name>"`) learns the format from before RL. Every
character the environment can send must appear in them (the tokenizer is built from
them).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from turnkeep.schemas.choices import RecoveryMode
from turnkeep.schemas.rollout import Problem, PromptRecord

__all__ = ["EnvContext", "Environment", "NoOptions", "Problem", "RecoveryMode", "StepResult"]


@dataclass(frozen=True)
class StepResult:
    observation: str | None
    """Text fed back to the policy (a tool's reply), or None when nothing is fed back."""
    done: bool
    """True after a final answer or a turn that ends the episode."""
    role: Literal["tool", "user"] = "tool"
    """The chat role the observation is rendered as."""


class NoOptions(BaseModel):
    """The options of a class that takes none: any key is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class EnvContext:
    """What the environment server gives every environment it builds."""

    tool_latency_s: float = 0.0
    """Added latency of each tool call (to mimic slow tools)."""
    workspace_root: Path | None = None
    """Folder under which environments with files on disk make their own workspace (None: the system's temp)."""
    options: BaseModel = NoOptions()
    """The class's `Options`, validated from `[environments.<name>] options` once at start-up."""
    seed: int = 0
    """The episode's seed, the same for every attempt of one sibling of a group (`replay` environments draw their
    randomness from it, so a replay after a restore meets the same episode)."""


class Environment(ABC):
    """One episode. Subclass it, set `kind` and `recovery_mode`, implement the abstract methods."""

    kind: ClassVar[str]
    """A short name for logs and capability reports."""
    recovery_mode: ClassVar[RecoveryMode]
    """How an unfinished episode comes back after a crash (see the module docstring)."""
    group_scored: ClassVar[bool] = False
    """True when `score_group` decides the rewards of all siblings of a group together."""
    Options: ClassVar[type[BaseModel]] = NoOptions
    """A pydantic model of the class's options; a config whose options it refuses stops the run at start-up."""
    demonstration_template: ClassVar[str | None] = None
    """The made-up tiny model's chat template for `demonstrations` (None: the line protocol,
    `envs.codec.LINE_TEMPLATE`); its lines must be the demonstrations' lines."""
    demonstration_tokens: ClassVar[tuple[str, ...]] = ()
    """Strings the tiny model's tokenizer keeps whole (the tags of a tool format, as a real tokenizer has them)."""

    @abstractmethod
    def __init__(self, problem: Problem, ctx: EnvContext) -> None: ...

    async def begin(self) -> None:
        """Open what the episode needs that takes time (a session with a server), before `prompt()`: the server
        awaits it, so `prompt()` and `tools()` then answer at once without blocking its loop. Default: nothing."""

    @abstractmethod
    def prompt(self) -> str:
        """The first user message (for the tiny model's line protocol, one line with its newline)."""

    @abstractmethod
    async def step(self, turn_text: str) -> StepResult:
        """Act on one generated turn (call tools); may take time."""

    @abstractmethod
    def reward(self) -> float:
        """The verifier's reward for the episode so far."""

    def tools(self) -> list[dict[str, Any]] | None:
        """JSON schemas of the episode's tools, for chat templates that list them (Qwen's `tools`); None: no list.
        A template that renders no tools (SmolLM2's ChatML) gets them described in the system message instead."""
        return None

    def system_prompt(self) -> str | None:
        """The system message opening the conversation; None: the chat template's own default, if it has one."""
        return None

    def export_state(self) -> dict[str, Any] | None:
        """JSON-ready state at a turn boundary (`exported` environments); None: nothing to export."""
        return None

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from `export_state()`'s output; only called on a fresh environment."""
        raise NotImplementedError(f"{self.kind} environments ({self.recovery_mode}) do not restore exported state")

    async def replay(self, turns: list[str]) -> list[str | None]:
        """Rebuild a fresh environment by stepping the saved policy turns again; returns each turn's observation."""
        if self.recovery_mode not in (RecoveryMode.STATELESS, RecoveryMode.REPLAY):
            raise NotImplementedError(f"{self.kind} environments ({self.recovery_mode}) cannot be replayed")
        return [(await self.step(turn)).observation for turn in turns]

    def reward_parts(self) -> dict[str, float]:
        """Named parts of the reward (a rubric's functions), recorded with the row's metrics; {}: none."""
        return {}

    @classmethod
    def recovery_mode_for(cls, options: BaseModel) -> RecoveryMode:
        """The recovery mode of this class with these options (an adapter's environments differ: `options.replay`);
        an instance's `recovery_mode` must agree with it."""
        return RecoveryMode(cls.recovery_mode)

    @classmethod
    def dataset(cls, options: BaseModel, split: Literal["train", "heldout"]) -> list[PromptRecord] | None:
        """The environment's own prompts (an ecosystem's dataset), used when the run has no `data.train`; each
        record's metadata reaches the episode as `problem.metadata`. None: it has none."""
        return None

    @classmethod
    async def warm_up(cls, options: BaseModel) -> None:
        """Start what every episode of the class shares (an adapter's server) before the first episode needs it:
        the environment server runs it once at its start, in the background."""

    async def close(self) -> None:
        """Release what the episode holds (files, processes); called once, however the episode ended."""

    @classmethod
    def score_group(cls, problem: Problem, sibling_turns: list[list[str]]) -> list[float]:
        """Rewards of all siblings of a group, scored together (`group_scored` environments only)."""
        raise NotImplementedError(f"{cls.kind} environments are not group-scored")

    @classmethod
    def demonstrations(cls, rng: random.Random, count: int, options: BaseModel) -> list[str]:
        """`count` whole conversations (prompt, turns, observations, concatenated as the tiny model's line
        protocol renders them) for a made-up model's supervised warm start; some may be deliberately wrong."""
        raise NotImplementedError(f"{cls.kind} environments offer no demonstrations")
