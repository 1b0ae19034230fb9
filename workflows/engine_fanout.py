"""One policy step on every policy engine at once, and the engines' answers combined into one.

A run has several policy engines, each with a worker of its own on `<run_id>.policy.<k>`. The attempt and recovery
workflows run a policy step on all of them side by side, so a step lasts as long as its slowest engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas.attempt_steps import GymCommitResult, GymReleaseResult, PolicyPrepareResult
    from turnkeep.schemas.names import ErrorType

from turnkeep.workflows.timed_activity import tick

T = TypeVar("T")
EngineCall = Callable[[dict[str, float], "int | None"], Awaitable[T]]
"""`call(clock, engine)`: the step on one engine (None: the one policy server), its seconds added to `clock`."""


async def fan_out(seconds: dict[str, float], phase: str, engines: list[int] | None, call: EngineCall) -> list[T]:
    """`call` on every engine in `engines` at once; one answer per engine, in their order.

    None is a history recorded before engines: exactly the one call it recorded, on the policy server's queue. Every
    call is waited for, failed or not, so no engine is still mid-step when the workflow moves on (a compensation's
    abort must not overtake an engine's prepare); then the first failure is raised. The calls overlap, so the phase's
    clock gains the fan-out's wall time, not the sum of the calls' (they tick a scratch clock)."""
    if engines is None:
        return [await call(seconds, None)]
    if not engines:
        return []
    began = workflow.time()
    try:
        answers = await asyncio.gather(*(call({}, engine) for engine in engines), return_exceptions=True)
    except asyncio.CancelledError:
        tick(seconds, phase, began)
        raise
    tick(seconds, phase, began)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return list(answers)


def slowest_s(answers: list) -> float:
    """The engines ran side by side: their participant seconds are the slowest one's."""
    return max((answer.participant_s for answer in answers), default=0.0)


def prepared(answers: list[PolicyPrepareResult]) -> PolicyPrepareResult:
    return PolicyPrepareResult(participant_s=slowest_s(answers), drained=sum(answer.drained for answer in answers))


def released(answers: list[GymReleaseResult]) -> GymReleaseResult:
    return GymReleaseResult(participant_s=slowest_s(answers),
                            admission_closed_s=max((answer.admission_closed_s for answer in answers), default=0.0))


def committed(answers: list[GymCommitResult], engines: list[int] | None) -> GymCommitResult:
    """Every engine's artifacts; counts summed, except the policy version, which every engine must share (a snapshot
    records one). Engines that disagree fail the attempt, which compensates: nothing is published."""
    versions = {engine: answer.counts["policy_version"]
                for engine, answer in zip(engines or [None], answers) if "policy_version" in answer.counts}
    if len(set(versions.values())) > 1:
        named = ", ".join(f"engine {engine} at policy version {version}" for engine, version in versions.items())
        raise ApplicationError(f"the policy engines disagree on the policy version: {named}",
                               type=ErrorType.PARTICIPANT_REFUSED, non_retryable=True)
    counts: dict[str, int] = {}
    for answer in answers:
        for key, value in answer.counts.items():
            counts[key] = counts.get(key, 0) + value
    if versions:  # one version, not their sum
        counts["policy_version"] = next(iter(versions.values()))
    return GymCommitResult(participant_s=slowest_s(answers), counts=counts,
                           artifacts=[artifact for answer in answers for artifact in answer.artifacts])
