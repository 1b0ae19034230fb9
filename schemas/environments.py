"""What each environment can do for recovery, and the level the controller gives it.

An environment server reports one `EnvironmentCapabilities` per configured environment
(`GET /environments`); the controller lowers `rollout_recovery.target_level` for each
from that report (`controller/rollout_levels.py`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from turnkeep.schemas.choices import RecoveryLevel, RecoveryMode
from turnkeep.schemas.rollout import Problem
from turnkeep.schemas.wire import Wire

LEVELS_FINE_TO_COARSE: tuple[RecoveryLevel, ...] = tuple(RecoveryLevel)
FINEST_LEVEL: dict[RecoveryMode, RecoveryLevel] = {
    RecoveryMode.STATELESS: RecoveryLevel.TOKEN, RecoveryMode.REPLAY: RecoveryLevel.TOKEN,
    RecoveryMode.EXPORTED: RecoveryLevel.TOKEN,
    RecoveryMode.RESTART_ONLY: RecoveryLevel.SIBLING,
}
"""The finest level each recovery mode supports."""


def coarser(a: RecoveryLevel, b: RecoveryLevel) -> RecoveryLevel:
    return RecoveryLevel(max(a, b, key=LEVELS_FINE_TO_COARSE.index))


class EnvironmentCapabilities(Wire):
    name: str
    """The environment's name in the run's `[environments]` table."""
    kind: str
    """Its implementation (`calc`, `workspace`, `lab`, `judge`)."""
    recovery_mode: RecoveryMode
    """How an episode comes back after a restore."""
    group_scored: bool = False
    """True when its reward scores all siblings of a group together."""
    group_size: int | None = None
    """Siblings it scores together (group-scored environments only)."""


class JudgeRequest(Wire):
    group_id: str
    """The group being scored (for logs)."""
    problem: Problem
    """The group's problem; `problem.env` names the group-scored environment."""
    policy_turns: list[list[list[int]]]
    """Per sibling, in sibling order: the token ids of each policy turn."""


class JudgeReply(Wire):
    rewards: list[float]
    """One reward per sibling, in the request's order."""


class RolloutLimits(Wire):
    """The run's limits on one agent's episode, as an environment server applies them."""

    max_turns: int = Field(ge=1)
    max_tokens_per_turn: int = Field(ge=1)
    max_model_len: int = Field(ge=2)
    temperature: float = Field(ge=0)
    stream_turns: bool = False
    """Stream each turn from the engine and report its progress in chunks (the audit log's `turn_tokens`)."""
    partial_turn_environments: list[str] = []
    """Environments at the `token` level: their turns stream, each chunk is journaled too, and a restore continues
    a cut turn from it."""
    partial_every_tokens: int = Field(default=32, ge=1)
    """A chunk is this many tokens ..."""
    partial_every_s: float = Field(default=0.25, gt=0)
    """... or what streamed in this long, whichever comes first."""
    replay_timeout_s: float = Field(default=60.0, gt=0)
    """A replay that rebuilds a restored agent takes at most this long (`env.replay_timeout_s`)."""


PolicyUrl = Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048)]
"""A policy engine's base URL (its completions are at `<url>/v1/completions`)."""


class AttachRequest(Wire):
    """Body of `POST /attach`: the run gives an environment server what it needs to run agents."""

    run_id: str = Field(min_length=1, max_length=200)
    """The run attaching; a different run or incarnation than the current one cancels the old one's agents."""
    incarnation: int = Field(ge=0)
    """The controller incarnation attaching."""
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    """The server's participant name in this run (its `[environments.<name>]` for a remote server); also its
    folder inside a snapshot, hence a plain name."""
    policy_url: PolicyUrl
    """Where the agents' policy calls go (`/v1/completions`)."""
    policy_urls: list[PolicyUrl] = Field(default=[], max_length=1024)
    """Every policy engine's base URL; the server routes the agents' calls over them. Empty: just `policy_url`."""
    limits: RolloutLimits
    """Turn and token limits of every episode."""
    model_files: dict[str, str]
    """The policy model's tokenizer and config files (name -> text): the server renders conversations with them."""
    group_size: int = Field(ge=1, le=4096)
    """rollout.group_size (a group-scored environment scores exactly one group)."""


class EnginesUpdate(Wire):
    """Body of `PUT /engines`: the controller's list of routable policy engines, sent after it replaces one."""

    urls: list[PolicyUrl] = Field(min_length=1, max_length=1024)
    """Every engine new calls may go to (live, at the current policy version), in tie-breaking order; an engine
    left out takes no new calls, and one named again after a failure takes calls again."""


class AttachReply(Wire):
    name: str
    """The participant name the server now answers to."""
    attachment: str
    """`<run_id>:<incarnation>` the server is attached to."""
    environments: list[EnvironmentCapabilities]
    """What each of its environments can do for recovery."""
