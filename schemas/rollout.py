"""Rollout messages between the controller, the environment server and the trainer."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnkeep.schemas.wire import Wire


class Segment(Wire):
    kind: Literal["prompt", "policy", "tool"]
    """Who produced these tokens: the task prompt, the policy (trained on), or a tool result."""
    token_ids: list[int]
    """Token ids of this segment."""
    logprobs: list[float] | None = None
    """Generation logprob of each token (policy segments only)."""
    policy_version: int | None = None
    """Policy version that generated the segment (policy segments only); the newest, when `token_versions` is set."""
    token_versions: list[int] | None = None
    """Policy version of each token, set only when they differ: a turn cut by a crash, whose journaled tokens an
    older policy generated and whose rest a newer one generated after the restore."""

    @model_validator(mode="after")
    def _one_version_per_token(self) -> "Segment":
        if self.token_versions is None:
            return self
        if len(self.token_versions) != len(self.token_ids):
            raise ValueError(f"token_versions has {len(self.token_versions)} versions for {len(self.token_ids)} tokens")
        if self.policy_version != max(self.token_versions, default=None):
            raise ValueError(f"policy_version {self.policy_version} is not the newest of token_versions")
        return self

    @classmethod
    def policy_turn(cls, token_ids: list[int], logprobs: list[float], versions: list[int]) -> "Segment":
        """A policy turn from each token's id, logprob and version: `token_versions` only where they differ."""
        mixed = len(set(versions)) > 1
        return cls(kind="policy", token_ids=token_ids, logprobs=logprobs, policy_version=max(versions, default=None),
                   token_versions=versions if mixed else None)

    def versions(self) -> list[int]:
        """Every policy version that generated a token of this segment."""
        if self.token_versions is not None:
            return sorted(set(self.token_versions))
        return [self.policy_version] if self.policy_version is not None else []


class Problem(Wire):
    question: str
    """Prompt text shown to the agent (for example `Q 37+48-12`)."""
    answer: int | float | str | None = None
    """The verifier's expected answer (None: the environment judges without one)."""
    env: str = "calc"
    """Name of the configured environment (`[environments.<name>]`) that runs this problem."""
    metadata: dict[str, Any] = {}
    """Any other fields of the prompt's record (a prompts file), for the environment."""


class PromptRecord(BaseModel):
    """One prompt of a prompt source: a checked record of a prompts file, or a generated problem."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str
    """Text the environment shows (`Problem.question`)."""
    answer: int | float | str | None = None
    """The verifier's expected answer (None: the environment judges without one)."""
    env: str | None = None
    """The `[environments]` entry that runs this prompt (None: chosen by weight)."""
    metadata: dict[str, Any] = {}
    """Every other field of the record."""


class RolloutRequest(Wire):
    rollout_id: str
    """Unique per attempt: `<group_id>.<sibling>.<attempt>`."""
    group_id: str
    """Prompt group this sibling belongs to."""
    sibling: int = Field(ge=0)
    """Index of the sibling within its group."""
    attempt: int = Field(ge=0)
    """Attempt number of this sibling (a retry or a restore starts a new one)."""
    problem: Problem
    """The task instance."""
    incarnation: int = Field(default=0, ge=0)
    """The controller incarnation that started this attempt (rollout ids repeat across the lineages that
    restores create; a turn journal's records are matched by id and incarnation)."""
    resume_from: str | None = None
    """Saved attempt (its rollout id) to continue from its saved turn boundary after a restore;
    the environment server must hold it (`/checkpoint/restore`). None starts from scratch."""
    evaluation_temperature: float | None = Field(default=None, ge=0)
    """Set for a held-out evaluation's rollout: sampled at this temperature, kept out of the turn journal, the audit
    and snapshots (the controller journals its reward when it ends), its result needing no ACK."""


class RolloutOutcome(StrEnum):
    FINISHED = "finished"
    TRUNCATED = "truncated"
    FAILED = "failed"
    TIMED_OUT = "timed_out"

    def is_error(self) -> bool:
        return self in (RolloutOutcome.FAILED, RolloutOutcome.TIMED_OUT)


class RolloutRow(Wire):
    group_id: str
    """Prompt group."""
    sibling: int
    """Sibling index."""
    attempt: int
    """Attempt that produced the row."""
    segments: list[Segment]
    """The whole conversation: prompt, policy turns and tool results."""
    reward: float
    """Verifier reward."""
    reward_parts: dict[str, float] = {}
    """Named parts of the reward where the environment has them (an adapted rubric's functions)."""
    num_turns: int
    """Policy turns taken."""
    truncated: bool = False
    """The episode ended without its final answer (max_turns or max_model_len reached): `algorithm.mask_truncated`
    leaves it out of the loss."""

    def policy_versions(self) -> list[int]:
        return [v for s in self.segments for v in s.versions()]

    def generated_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.kind == "policy")


class RolloutResult(Wire):
    rollout_id: str
    """Echo of the request's id."""
    outcome: RolloutOutcome
    """How the rollout ended."""
    reason: str = ""
    """Why it ended that way (empty when finished normally)."""
    row: RolloutRow | None = None
    """The finished row (None when the rollout failed)."""
    receipt: str = ""
    """ACK this after storing the row; until then the server keeps the result."""


class TurnBoundary(Wire):
    rollout_id: str
    """Rollout attempt the record belongs to."""
    turn_index: int
    """Turns completed so far (policy turn plus its tool result)."""
    segments: list[Segment]
    """The conversation so far as token ids, with the policy version of each generated turn."""
    done: bool = False
    """The episode ended at this boundary (a continuation only scores it and returns the row)."""


class AckRequest(Wire):
    receipt: str = Field(min_length=1, max_length=512)
    """Receipt from a RolloutResult."""


class CancelRequest(Wire):
    rollout_id: str = Field(min_length=1, max_length=512)
    """The running rollout to stop (its agent's task is cancelled; nothing is kept)."""
