"""Rebuild a restored agent of a `stateless` or `replay` environment by replaying its journaled turns.

The journal holds every action (each policy turn) and every observation (the template's text after it). A fresh
instance, made with the sibling's seed, steps the saved turns again; each observation must give back exactly the
saved text. A difference, an error or a replay past `env.replay_timeout_s` means the environment cannot be brought
back: the sibling reruns from scratch, and the first differing turn is named in the log and in the audit's
`replay_checked` line, which also records every replay's turns and seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import Environment
from turnkeep.primitives.audit_log import AuditLog
from turnkeep.schemas.audit import ReplayChecked
from turnkeep.schemas.rollout import RolloutRequest, TurnBoundary

log = logging.getLogger("turnkeep.env")


class ReplayFailed(RuntimeError):
    """A saved agent's replay did not give back its journaled observations; its sibling reruns from scratch."""


@dataclass(frozen=True)
class ReplayOutcome:
    turns: int
    seconds: float
    diverged_turn: int | None = None
    reason: str = ""


async def replay_to_boundary(env: Environment, codec: TurnCodec, boundary: TurnBoundary, request: RolloutRequest,
                             timeout_s: float, audit: AuditLog | None) -> ReplayOutcome:
    """Replay the boundary's turns on `env` (fresh); raises ReplayFailed naming the environment, rollout and turn."""
    turns = [codec.turn_text(seg.token_ids) for seg in boundary.segments if seg.kind == "policy"]
    started = time.monotonic()
    outcome = await _replay(env, codec, boundary, turns, timeout_s, started)
    _record(audit, request, outcome)
    if outcome.reason:
        message = (f"environment {request.problem.env!r} ({env.kind}): rollout {request.resume_from} cannot continue "
                   f"by replay, {outcome.reason}; its sibling reruns from scratch")
        log.warning("%s", message)
        raise ReplayFailed(message)
    return outcome


async def _replay(env: Environment, codec: TurnCodec, boundary: TurnBoundary, turns: list[str], timeout_s: float,
                  started: float) -> ReplayOutcome:
    try:
        replayed = await asyncio.wait_for(env.replay(turns), timeout_s)
    except asyncio.TimeoutError:
        return ReplayOutcome(len(turns), time.monotonic() - started,
                             reason=f"its {len(turns)} turns took longer than env.replay_timeout_s = {timeout_s:g} s")
    except Exception as err:  # noqa: BLE001 - whatever the environment raises while replaying, the sibling reruns
        return ReplayOutcome(len(turns), time.monotonic() - started,
                             reason=f"the replay raised {type(err).__name__}: {err}")
    seconds = time.monotonic() - started
    diverged = codec.first_replay_difference(boundary.segments, replayed)
    if diverged is None:
        return ReplayOutcome(len(turns), seconds)
    saved = codec.turns_with_glue(boundary.segments)
    observation = replayed[diverged] if diverged < len(replayed) else None
    expected = _digest(codec.decode(saved[diverged][1])) if diverged < len(saved) else "none"
    got = _glue_digest(codec, saved[diverged][0], observation) if diverged < len(saved) and diverged < len(replayed) \
        else "none"
    return ReplayOutcome(len(turns), seconds, diverged, reason=(
        f"turn {diverged}'s observation differs from the journaled one (journaled sha256 {expected}, replayed "
        f"{got}: {str(observation)[:80]!r})"))


def _glue_digest(codec: TurnCodec, turn_ids: list[int], observation: str | None) -> str:
    """The replayed observation as the template writes it after the turn, digested like the journaled text."""
    return _digest(codec.decode(codec.after_turn(turn_ids, observation, "tool")))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _record(audit: AuditLog | None, request: RolloutRequest, outcome: ReplayOutcome) -> None:
    if audit is not None:
        audit.emit(ReplayChecked, rollout_id=request.rollout_id, resumed_from=request.resume_from or "",
                   env=request.problem.env, turns=outcome.turns, seconds=round(outcome.seconds, 4),
                   diverged_turn=outcome.diverged_turn, reason=outcome.reason)
